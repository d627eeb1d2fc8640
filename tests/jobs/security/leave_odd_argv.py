"""Leaves a process behind whose argv holds escape codes and markup (its name is whatever
its starter gave it): run names it when it stops the leftovers."""

import subprocess

subprocess.Popen(["sl\x1b]0;owned\x07\x1b[2J[red]x", "30"], executable="/bin/sleep")
