"""Unit tests of ringserve.worker."""
