"""Synthetic request logs with planted cache-miss causes (``replay synth``).

The entry point and the documentation of the planted causes and ground truth
are in :mod:`replay.synth.generator` (``generate``, ``synth_main``).
"""
