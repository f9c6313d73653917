"""What several test modules share: generated logs, brute-force references of the
compiled kernels, and small builders of logs and databases. Test modules import
from here (or use conftest.py fixtures), never from each other."""
