"""The Textual dashboard (`distdoctor watch`), installed as `distdoctor.tui`."""
