#!/usr/bin/env python3
"""Checks a viewer page as Chromium left it (its --dump-dom output) against the document it was made from.

The page writes its outcome on <body>: data-rendered ("ok" once drawn, "error" after any script error),
data-errors, and what it drew: data-series (two lines per stack: reserved and live), data-points (the most
points in one line, after the page's own downsampling to 2,000), data-maps, data-segments and data-blocks
(the maps shown on load: each trace's first stack), data-render-ms, data-ready-ms. The expected values
are computed here from the JSON, by the page's documented rules, not copied from a run.

    check_dom.py DOCUMENT.json DUMPED_DOM.html [--max-ready-ms N] [--selftest]
With --selftest (the page opened as page.html#selftest) it also checks that the page showed every stack's
map and that hovering a map and a chart gave tooltips (data-hover-map, data-hover-chart).
Prints one line per check; exit 1 if any failed.
"""
import argparse
import html.parser
import json
import math
import sys

MAX_POINTS = 2000  # the page's downsampling limit (viewer.js MAX_POINTS)


class BodyAttributes(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.body = None

    def handle_starttag(self, tag, attrs):
        if tag == 'body' and self.body is None:
            self.body = dict(attrs)


def downsampled(n):
    if n <= MAX_POINTS:
        return n
    per = math.ceil(n / MAX_POINTS)
    return math.ceil(n / per)


def expected(doc):
    if 'traces' in doc:
        stacks = [s for t in doc['traces'] for s in t['stacks']]
        shown = [t['stacks'][0]['peak_map']['snapshot'] for t in doc['traces']
                 if t['stacks'] and t['stacks'][0].get('peak_map') and t['stacks'][0]['peak_map'].get('snapshot')]
        points = max((downsampled(len(s['timeline']['op'])) for s in stacks), default=0)
        series = 2 * len(stacks)
    else:
        shown, points, series = [doc], 0, 0
    return {'series': series, 'points': points, 'maps': len(shown),
            'segments': sum(len(s['segments']) for s in shown),
            'blocks': sum(len(seg['blocks']) for s in shown for seg in s['segments'])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('document')
    parser.add_argument('dom')
    parser.add_argument('--max-ready-ms', type=float, default=None)
    parser.add_argument('--selftest', action='store_true', help='the page was opened as page.html#selftest')
    args = parser.parse_args()
    with open(args.document) as f:
        doc = json.load(f)
    reader = BodyAttributes()
    with open(args.dom, errors='replace') as f:
        reader.feed(f.read())
    body = reader.body
    if body is None:
        print(f'FAIL {args.dom}: no <body> in the dumped DOM (did Chromium load the page?)')
        return 1
    failures = 0

    def check(what, ok, detail):
        nonlocal failures
        print(('ok   ' if ok else 'FAIL ') + what + ': ' + detail)
        failures += not ok

    check('rendered', body.get('data-rendered') == 'ok', f"data-rendered={body.get('data-rendered')!r}")
    check('no script errors', body.get('data-errors') == '0', f"data-errors={body.get('data-errors')!r}")
    for key, value in expected(doc).items():
        got = body.get('data-' + key)
        check(key, got == str(value), f'page drew {got}, the document has {value}')
    points = int(body.get('data-points', '0') or 0)
    check('points within the limit', points <= MAX_POINTS, f'{points} <= {MAX_POINTS}')
    if expected(doc)['blocks']:
        rects = int(body.get('data-rects', '0') or 0)
        check('map drawn', rects > 0, f'{rects} rectangles')
    if args.selftest:
        check('self-test ran', body.get('data-selftest') == 'done', f"data-selftest={body.get('data-selftest')!r}")
        hover_map = body.get('data-hover-map', '')
        check('hover on the map', hover_map.startswith('segment #0') and 'size ' in hover_map, repr(hover_map))
        if 'traces' in doc:
            hover_chart = body.get('data-hover-chart', '')
            check('hover on a chart', hover_chart.startswith('operation ') and 'reserved ' in hover_chart, repr(hover_chart))
    ready = float(body.get('data-ready-ms', 'nan'))
    print(f"time render {body.get('data-render-ms')} ms, ready {ready} ms after navigation began")
    if args.max_ready_ms is not None:
        check('fast enough', ready < args.max_ready_ms, f'{ready} ms < {args.max_ready_ms} ms')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
