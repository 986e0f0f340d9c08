"""Unit tests of ringserve.common."""
