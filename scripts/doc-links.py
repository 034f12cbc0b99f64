#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown files: the file must exist,
and a `#fragment` into a Markdown file must name one of its headings (GitHub's slugs).
Links inside code are not links. Run by .ci/run; prints `BROKEN` / `BAD ANCHOR` lines
and a summary, and exits 1 if any link is broken.

    scripts/doc-links.py [ROOT]
"""
import os, re, sys, pathlib, unicodedata
root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else '.').resolve()
SKIP = {'target', '.git', 'node_modules'}
def md_files():
    for dp, dns, fns in os.walk(root):
        dns[:] = [d for d in dns if d not in SKIP and not d.startswith('.gpu') and not d.startswith('target')]
        for f in fns:
            if f.endswith('.md'):
                yield pathlib.Path(dp) / f

def strip_code(text):
    # remove fenced code blocks and inline code
    text = re.sub(r'^(```|~~~).*?^\1[^\n]*$', '', text, flags=re.S | re.M)
    text = re.sub(r'`[^`\n]*`', '', text)
    return text

def slug(h):
    h = h.strip().lower()
    h = re.sub(r'<[^>]+>', '', h)
    out = []
    for ch in h:
        cat = unicodedata.category(ch)
        if ch in ' -_' or cat[0] in 'LN':
            out.append(ch)
    return ''.join(out).replace(' ', '-')

def headings(path):
    text = path.read_text()
    text = re.sub(r'^(```|~~~).*?^\1[^\n]*$', '', text, flags=re.S | re.M)
    seen = {}
    res = set()
    for m in re.finditer(r'^#{1,6}\s+(.*?)\s*#*\s*$', text, flags=re.M):
        raw = re.sub(r'`', '', m.group(1))
        raw = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', raw)
        s = slug(raw)
        n = seen.get(s, 0)
        res.add(s if n == 0 else f'{s}-{n}')
        seen[s] = n + 1
    return res

LINK = re.compile(r'!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
REF = re.compile(r'^\s*\[[^\]]+\]:\s*(\S+)', re.M)
bad = 0; total = 0; anchors = 0
for f in sorted(md_files()):
    text = strip_code(f.read_text())
    targets = LINK.findall(text) + REF.findall(text)
    for t in targets:
        if re.match(r'^[a-z][a-z0-9+.-]*:', t, re.I):
            continue  # http:, https:, mailto:
        total += 1
        path, _, frag = t.partition('#')
        tgt = (f.parent / path).resolve() if path else f
        rel = f.relative_to(root)
        if not tgt.exists():
            print(f'BROKEN {rel}: {t}'); bad += 1; continue
        if frag and tgt.is_file() and tgt.suffix == '.md':
            anchors += 1
            if frag not in headings(tgt):
                print(f'BAD ANCHOR {rel}: {t}'); bad += 1
print(f'{total} relative links checked ({anchors} with #anchors into .md files), {bad} broken')
sys.exit(1 if bad else 0)
