"""normconf reports: results (+ pytest-benchmark JSON) -> one self-contained HTML file, or Markdown.

Pure table building lives in ``tables``, ``sections`` and ``bench``; ``html`` (Jinja2) and
``markdown`` only format those tables. The CLI reaches the renderers through the
``normconf.renderers`` entry points.
"""
