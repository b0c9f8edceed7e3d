"""Anyone's text on one line: what users name (files, reasons) and what daemons say reaches
logs, records and terminals, where a line end would forge a line and an escape sequence
rewrite what a terminal shows."""


def printable(text: str) -> str:
    """`text` with every character that is not printable (line ends, escapes) as "?"."""
    return "".join(c if c.isprintable() else "?" for c in text)
