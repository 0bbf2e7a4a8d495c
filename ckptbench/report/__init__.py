"""Reports from result documents: PNG plots, and one self-contained HTML (or Markdown) report of them
(``ckptbench report``). Console tables are the commands' own (``cli/``)."""
