"""Unit tests of ringserve.shm."""
