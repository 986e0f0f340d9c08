"""Unit tests of ringserve.supervision."""
