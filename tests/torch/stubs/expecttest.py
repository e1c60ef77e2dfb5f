"""expecttest.py: a stand-in for the expecttest package, which torch's test
utilities import and Debian does not package. torch's distributed tests use
only its TestCase base and the ACCEPT flag; no expect-file test runs here."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
