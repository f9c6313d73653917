"""replay — how much would prefix caching save on *our* traffic?"""

__version__ = "0.1.0"
