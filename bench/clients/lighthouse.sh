#!/usr/bin/env bash
# Lighthouse 12.8 (accessibility, performance's layout shift) on the app's main page, desktop and mobile,
# English and Arabic, with the system Chromium. Not a CI test: the targets are accessibility >= 95 and
# CLS <= 0.1 on the main page (the browser tests' axe-core run is what CI checks).
#
#   python app.py --models tiny --device cpu --port 7860 &     # or any running app, on loopback
#   bash bench/clients/lighthouse.sh                            # BASE=http://127.0.0.1:7860 by default
#
# Lighthouse comes from npm through npx (pinned); CHROME_PATH names the browser (/usr/bin/chromium).
# Each run's JSON report goes to $OUT; the table prints the scores and the CLS of each run.
set -euo pipefail
BASE="${BASE:-http://127.0.0.1:7860}"
OUT="${OUT:-$(mktemp -d)}"
LIGHTHOUSE="${LIGHTHOUSE:-npx -y lighthouse@12.8}"
export CHROME_PATH="${CHROME_PATH:-/usr/bin/chromium}"
# wait for warm-up, so the page measured is the one a visitor gets once the models are ready
until curl -sf "$BASE/readyz" >/dev/null; do sleep 1; done
printf '%-8s %-4s %13s %11s %6s\n' form lang accessibility performance CLS
for form in desktop mobile; do
  for lang in en ar; do
    preset=()
    [ "$form" = desktop ] && preset=(--preset=desktop)
    report="$OUT/lighthouse-$form-$lang.json"
    $LIGHTHOUSE "$BASE/?lang=$lang" "${preset[@]}" --only-categories=accessibility,performance \
      --chrome-flags="--headless=new --no-sandbox" --output=json --output-path="$report" --quiet
    python3 - "$report" "$form" "$lang" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
cats, audits = report["categories"], report["audits"]
cls = audits["cumulative-layout-shift"]["numericValue"]
print(f"{sys.argv[2]:<8} {sys.argv[3]:<4} {cats['accessibility']['score'] * 100:13.0f} "
      f"{cats['performance']['score'] * 100:11.0f} {cls:6.3f}")
for audit in cats["accessibility"]["auditRefs"]:
    found = audits[audit["id"]]
    if found.get("score") is not None and found["score"] < 1 and audit["weight"] > 0:
        print(f"    accessibility: {audit['id']}: {found['title']}")
PY
  done
done
echo "reports under $OUT"
