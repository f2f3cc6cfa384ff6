"""Rendering primitives shared by reports, notebooks and tables: fixed-point numbers, HTML
fragments and matplotlib figures as PNG bytes. They read no headwise objects, only values."""
