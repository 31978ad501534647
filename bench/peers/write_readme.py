#!/usr/bin/env python3
"""Put bench/out/peers/table.md into bench/README.md between the markers of the section
"Side by side with every peer" (run after run_table.py; the prose around the table is
edited by hand)."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(os.path.dirname(HERE), "README.md")
TABLE = os.path.join(os.path.dirname(HERE), "out", "peers", "table.md")
BEGIN, END = "<!-- peers table begin -->", "<!-- peers table end -->"

text = open(README).read()
table = open(TABLE).read()
a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
with open(README, "w") as f:
    f.write(text[:a] + "\n" + table + text[b:])
