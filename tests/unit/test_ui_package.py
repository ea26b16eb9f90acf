"""The dashboard's files ship in the package and fetch nothing from elsewhere."""

from __future__ import annotations

import io
import re
import zipfile

from gpuhop.agent.ui.pages import STATIC_DIR, STATIC_FILES
from gpuhop.client.wheel import build_wheel

# What a page or a script may point at: only the dashboard's own paths.
REFERENCE = re.compile(r"""(?:src|href)=["']([^"']+)["']|from\s+["']([^"']+)["']""")


def test_the_wheel_carries_every_dashboard_file():
    _name, data = build_wheel()
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    files = sorted(p.name for p in STATIC_DIR.iterdir())
    assert {"jobs.html", "job.html", "gpus.html", "style.css", "chart.js"} <= set(files)
    assert {f"gpuhop/agent/ui/static/{f}" for f in files} <= names


def test_pages_load_only_the_packages_own_files_and_no_inline_script():
    pages, scripts = sorted(STATIC_DIR.glob("*.html")), sorted(STATIC_DIR.glob("*.js"))
    # The loops below check nothing over no files, or with a pattern that finds nothing.
    assert {"jobs.html", "job.html", "gpus.html"} <= {p.name for p in pages}
    assert {"jobs.js", "job.js", "gpus.js", "chart.js"} <= {s.name for s in scripts}
    for page in pages:
        text = page.read_text()
        assert "<script>" not in text and "style=" not in text, page.name
        refs = [m.group(1) or m.group(2) for m in REFERENCE.finditer(text)]
        assert f"/ui/static/{page.stem}.js" in refs, (page.name, refs)  # each loads its own
        for ref in refs:
            if ref == "data:,":
                continue  # the empty favicon
            assert ref.startswith("/ui/static/"), (page.name, ref)
            assert ref.removeprefix("/ui/static/") in STATIC_FILES, (page.name, ref)
    imports = 0
    for script in scripts:
        text = script.read_text()
        assert "innerHTML" not in text and "eval(" not in text, script.name
        for match in REFERENCE.finditer(text):
            ref = match.group(2)
            if ref is not None:
                imports += 1
                assert ref.removeprefix("/ui/static/") in STATIC_FILES, (script.name, ref)
        # Nothing from the internet (the SVG namespace is a name, never fetched).
        bare = text.replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in bare and "https://" not in bare, script.name
    assert imports > 0, "no script's imports were found to check"
