"""Every rank refuses its command line (argparse exits 2) before any collective."""

import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", required=True)
parser.parse_args()
