# The package's import graph (issue 67): its modules, the imports between them and any circle. Not part of the package.
# `python nbs/experiments/import_graph.py [FOLDER]` (default dyspec_nb/; an older checkout: `git archive REV dyspec_nb | tar -x -C DIR`).
# A node is a module of the folder or a package it imports from within (`_linear`, `_native`, `kernels`); an edge is one
# importing module -> imported module, however many names or statements; `statements` counts the import statements.
import ast, collections, json, pathlib, re, sys

def import_graph(folder):
    "`(nodes, edges, statements)`: the modules of `folder` and what they import from the package, as sets, and the count of import statements."
    mods = {p.stem: p for p in pathlib.Path(folder).glob('*.py') if p.stem != '_modidx'}
    edges, statements = set(), 0
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or '').startswith('dyspec_nb')):
                mod = (node.module or '').removeprefix('dyspec_nb').lstrip('.')
                for target in ([mod] if mod else [a.name for a in node.names]):
                    target = target.split('.')[0]
                    if target and target != name: edges.add((name, target)); statements += 1
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith('dyspec_nb.'): edges.add((name, a.name.split('.')[1])); statements += 1
    return set(mods) | {b for _, b in edges}, edges, statements

def circles(edges):
    "The strongly connected components of more than one module (Tarjan): each is an import circle."
    out, index, low, stack, on = collections.defaultdict(set), {}, {}, [], set()
    for a, b in edges: out[a].add(b)
    found = []
    def visit(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in out[v]:
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: found.append(sorted(comp))
    for v in list(out):
        if v not in index: visit(v)
    return found

def layers(nbs='nbs/api'):
    "Each module's layer: the folder of `nbs` (`1-tree` ... `7-cli`) whose notebook exports it."
    out = {}
    for p in pathlib.Path(nbs).glob('*/*.ipynb'):
        for c in json.loads(p.read_text())['cells']:
            if m := re.search(r'#\|\s*default_exp\s+(\S+)', ''.join(c['source'])): out[m[1]] = p.parent.name
    return out

if __name__ == '__main__':
    nodes, edges, statements = import_graph(sys.argv[1] if len(sys.argv) > 1 else 'dyspec_nb')
    print(f"{len(nodes)} modules, {len(edges)} imports between them ({statements} import statements), circles: {circles(edges) or 'none'}")
    if len(sys.argv) == 1:                                 # this checkout: every import goes down the layers or stays in one
        at = layers()
        up = sorted(f"{a} ({at[a]}) -> {b} ({at[b]})" for a, b in edges if a in at and b in at and at[b] > at[a])
        print(f"imports up the layers: {'; '.join(up) or 'none'}")
