#!/usr/bin/env bash
# Render check for `ckptbench report`: build the HTML report from the reference runs in results/, open it
# in headless Chromium, take a full-width screenshot, and check the page really rendered (a PNG of the
# expected size that is not blank). Then LOOK at the screenshot: tables readable, figures shown, nothing
# cut off or overlapping.
#
# Usage:  bash tests/perf/report_render_check.sh [OUT_DIR]        (default: a new directory under /tmp)
#
# Installs nothing. Needs Chromium (Debian: `apt-get install --no-install-recommends chromium`; also
# found as chromium-browser, google-chrome, or $CHROMIUM). Without it the script says so and exits 77
# (the conventional "skipped" code); CI does not run it. results/ is only read.
# Writes OUT_DIR/report.html, OUT_DIR/report.md (+ PNGs), OUT_DIR/screenshot.png and, when Pillow is
# installed, OUT_DIR/screenshot-1.png... (the page cut into screen-sized pieces, easier to view).
set -euo pipefail

cd "$(dirname "$0")/../.."
out="${1:-$(mktemp -d /tmp/ckptbench-report-check.XXXXXX)}"
mkdir -p "$out"

browser="${CHROMIUM:-}"
for candidate in chromium chromium-browser google-chrome google-chrome-stable; do
  [ -n "$browser" ] && break
  command -v "$candidate" >/dev/null 2>&1 && browser="$candidate"
done
if [ -z "$browser" ]; then
  echo "report_render_check: no Chromium found (apt-get install --no-install-recommends chromium, or set CHROMIUM)" >&2
  exit 77
fi

# Every reference run of a schema the report reads (the others in results/ are skipped, with a warning).
python -m ckptbench report results/*.json --skip-unknown --title "ckptbench reference runs" \
  --html "$out/report.html" --markdown "$out/report.md"

if grep -Eq '(src|href)="(https?:)?//' "$out/report.html"; then
  echo "report_render_check: FAIL: the HTML refers to an external URL" >&2
  exit 1
fi

# Tall window: --screenshot captures the viewport only. No network, no GPU, no sandbox (root in CI boxes).
width=1280
height=9000
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --disable-extensions \
  --disable-background-networking --force-device-scale-factor=1 --window-size="$width,$height" \
  --screenshot="$out/screenshot.png" "file://$(realpath "$out/report.html")" >"$out/chromium.log" 2>&1 || {
  echo "report_render_check: FAIL: chromium exited with an error, see $out/chromium.log" >&2
  exit 1
}

python - "$out" <<'EOF'
import struct
import sys
from pathlib import Path

out = Path(sys.argv[1])
shot = out / "screenshot.png"
data = shot.read_bytes()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit(f"report_render_check: FAIL: {shot} is not a PNG")
width, height = struct.unpack(">II", data[16:24])
print(f"screenshot: {shot} ({width}x{height}, {len(data) / 1e3:.0f} kB)")
try:
    from PIL import Image
except ImportError:
    print("(Pillow not installed: no blank-page check and no pieces)")
    sys.exit(0)
image = Image.open(shot).convert("RGB")
# The page must not be blank: count rows that hold anything but the white background.
inked = sum(1 for y in range(0, image.height, 4) if image.crop((0, y, image.width, y + 1)).getextrema() != ((255, 255),) * 3)
if inked < 200:
    sys.exit(f"report_render_check: FAIL: the screenshot is almost blank ({inked} inked rows of {image.height // 4})")
# Find where the content ends, then cut it into pieces a screen high.
bottom = image.height
while bottom > 0 and image.crop((0, bottom - 1, image.width, bottom)).getextrema() == ((255, 255),) * 3:
    bottom -= 1
if bottom >= image.height - 1:
    print("note: the page is taller than the window; raise height in this script to see all of it")
piece = 1100
for i, top in enumerate(range(0, bottom, piece), 1):
    image.crop((0, top, image.width, min(top + piece, bottom))).save(out / f"screenshot-{i}.png")
print(f"content {bottom} px high, cut into {-(-bottom // piece)} pieces: {out}/screenshot-N.png")
EOF
echo "report_render_check: OK: open $out/report.html or view $out/screenshot*.png"
