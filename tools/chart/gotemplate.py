"""A renderer for the subset of Go templates (text/template plus Helm's functions) that the
TensorFusion chart uses, so the chart can be rendered where `helm` cannot be installed.

Supported, with Go's and Helm's semantics:
  actions        {{ pipeline }}, {{- ... -}} whitespace trimming, {{/* comments */}}
  control        if / else if / else / end, range (over a list or a map, optionally binding
                 `$v :=` or `$k, $v :=`), define / end
  values         .Values.a.b, .Release.Name, .Release.Namespace, .Chart.Name, .Chart.AppVersion,
                 . and $ (the root), $variables bound by range, "strings", numbers, true, false
  functions      include, quote, default, toYaml, nindent, indent, required, eq, ne, not, and, or
  pipelines      a | f b  (the piped value is the last argument), (sub pipelines)

Anything else (with, template, printf, tpl, lookup, genCA, ...) is refused with the line it is on,
so a chart change that leaves the subset fails here instead of rendering something helm would not.
toYaml emits sorted keys and block style as Helm does; scalar quoting may differ in style (single
versus double quotes) but never in the value a YAML parser reads back.
"""

import re

import yaml


class TemplateError(Exception):
    pass


_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_IDENT_CHAIN = re.compile(r"^(\$[A-Za-z0-9_]*|\.)?((?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")


# ---------------------------------------------------------------------------------------------
# Lexing: text and actions, with Go's trimming rules.

def _lex(src, name):
    """Returns [("text", s) | ("action", body, line)] with {{- / -}} trimming applied."""
    out = []
    pos = 0
    for m in _ACTION.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        if out and out[-1][0] == "trim_next":
            out.pop()
            text = text.lstrip(" \t\r\n")
        out.append(("text", text))
        body = m.group(2).strip()
        line = src.count("\n", 0, m.start()) + 1
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"{name}:{line}: unterminated comment")
        else:
            out.append(("action", body, line))
        if m.group(3):
            out.append(("trim_next",))
        pos = m.end()
    text = src[pos:]
    if out and out[-1][0] == "trim_next":
        out.pop()
        text = text.lstrip(" \t\r\n")
    out.append(("text", text))
    if "{{" in "".join(t[1] for t in out if t[0] == "text"):
        raise TemplateError(f"{name}: unbalanced '{{{{'")
    return [t for t in out if not (t[0] == "text" and t[1] == "")]


# ---------------------------------------------------------------------------------------------
# Parsing pipelines: "cmd args | cmd args", args are literals, fields, variables or (pipelines).

def _tokenize_pipeline(s, where):
    toks = []
    i = 0
    while i < len(s):
        c = s[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j = i + 1
            while j < len(s) and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            if j >= len(s):
                raise TemplateError(f"{where}: unterminated string")
            toks.append(("str", yaml.safe_load(s[i:j + 1])))  # Go's escapes are YAML's for ASCII
            i = j + 1
        elif c in "()|":
            toks.append((c, c))
            i += 1
        elif s.startswith(":=", i):
            toks.append((":=", ":="))
            i += 2
        elif c == ",":
            toks.append((",", ","))
            i += 1
        else:
            m = re.match(r"[^\s()|,\"]+", s[i:])
            word = m.group(0)
            if word.endswith(":") and s.startswith(":=", i + len(word) - 1):
                word = word[:-1]
            toks.append(("word", word))
            i += len(word)
    return toks


def _parse_pipeline(toks, where):
    """Parses a list of tokens into [command], command = [operand]."""
    cmds = [[]]
    i = 0

    def operand(i):
        kind, v = toks[i]
        if kind == "(":
            depth = 1
            j = i + 1
            while j < len(toks) and depth:
                depth += {"(": 1, ")": -1}.get(toks[j][0], 0)
                j += 1
            if depth:
                raise TemplateError(f"{where}: unbalanced '('")
            return ("pipe", _parse_pipeline(toks[i + 1:j - 1], where)), j
        if kind == "str":
            return ("lit", v), i + 1
        if kind != "word":
            raise TemplateError(f"{where}: unexpected '{v}'")
        if re.fullmatch(r"-?[0-9]+", v):
            return ("lit", int(v)), i + 1
        if re.fullmatch(r"-?[0-9]*\.[0-9]+", v):
            return ("lit", float(v)), i + 1
        if v in ("true", "false"):
            return ("lit", v == "true"), i + 1
        if v == "nil":
            return ("lit", None), i + 1
        m = _IDENT_CHAIN.match(v)
        if m and (m.group(1) or m.group(2)):
            base = m.group(1) or "."
            path = [p for p in m.group(2).split(".") if p]
            return ("field", base, path), i + 1
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            return ("func", v), i + 1
        raise TemplateError(f"{where}: cannot parse '{v}'")

    while i < len(toks):
        if toks[i][0] == "|":
            if not cmds[-1]:
                raise TemplateError(f"{where}: empty command before '|'")
            cmds.append([])
            i += 1
            continue
        op, i = operand(i)
        cmds[-1].append(op)
    if not cmds[-1]:
        raise TemplateError(f"{where}: empty pipeline")
    return cmds


# ---------------------------------------------------------------------------------------------
# The tree: lists of nodes; a node is ("text", s) | ("out", pipeline) | ("if", [(cond, body)], else)
# | ("range", vars, pipeline, body, else) | ("define", name, body).

def _parse(tokens, name):
    pos = 0

    def block(stop):
        nonlocal pos
        nodes = []
        while pos < len(tokens):
            tok = tokens[pos]
            if tok[0] == "text":
                nodes.append(("text", tok[1]))
                pos += 1
                continue
            body, line = tok[1], tok[2]
            where = f"{name}:{line}"
            word = body.split(None, 1)[0] if body else ""
            if word in stop:
                return nodes, word, body, where
            pos += 1
            rest = body[len(word):].strip()
            if word == "if":
                branches = [(_parse_pipeline(_tokenize_pipeline(rest, where), where), None)]
                else_body = []
                while True:
                    inner, end, end_body, end_where = block({"else", "end"})
                    branches[-1] = (branches[-1][0], inner)
                    pos += 1
                    if end == "end":
                        break
                    tail = end_body[len("else"):].strip()
                    if tail.startswith("if "):
                        cond = tail[3:].strip()
                        branches.append((_parse_pipeline(_tokenize_pipeline(cond, end_where),
                                                         end_where), None))
                        continue
                    if tail:
                        raise TemplateError(f"{end_where}: unsupported '{end_body}'")
                    else_body, end, _, end_where = block({"end"})
                    if end != "end":
                        raise TemplateError(f"{where}: 'if' without 'end'")
                    pos += 1
                    break
                nodes.append(("if", branches, else_body))
            elif word == "range":
                toks = _tokenize_pipeline(rest, where)
                variables = []
                if ":=" in [t[0] for t in toks]:
                    k = [t[0] for t in toks].index(":=")
                    variables = [t[1] for t in toks[:k] if t[0] == "word"]
                    if not 1 <= len(variables) <= 2 or not all(v.startswith("$") for v in variables):
                        raise TemplateError(f"{where}: range binds one or two $variables")
                    toks = toks[k + 1:]
                pipe = _parse_pipeline(toks, where)
                inner, end, end_body, end_where = block({"else", "end"})
                pos += 1
                else_body = []
                if end == "else":
                    else_body, end, _, _ = block({"end"})
                    pos += 1
                if end != "end":
                    raise TemplateError(f"{where}: 'range' without 'end'")
                nodes.append(("range", variables, pipe, inner, else_body))
            elif word == "define":
                m = re.fullmatch(r'"([^"]+)"', rest)
                if not m:
                    raise TemplateError(f"{where}: define takes one quoted name")
                inner, end, _, _ = block({"end"})
                if end != "end":
                    raise TemplateError(f"{where}: 'define' without 'end'")
                pos += 1
                nodes.append(("define", m.group(1), inner))
            elif word in ("else", "end"):
                raise TemplateError(f"{where}: unexpected '{word}'")
            elif word in ("with", "template", "block", "break", "continue"):
                raise TemplateError(f"{where}: '{word}' is outside the supported template subset")
            else:
                nodes.append(("out", _parse_pipeline(_tokenize_pipeline(body, where), where),
                              where))
        if stop:
            raise TemplateError(f"{name}: missing {{{{ end }}}}")
        return nodes, None, None, None

    nodes, _, _, _ = block(set())
    return nodes


# ---------------------------------------------------------------------------------------------
# Evaluation.

def _truthy(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def _gostr(v):
    """What Go's fmt prints for a value inside a template."""
    if v is None:
        return ""  # Helm replaces "<no value>" with an empty string
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e21:
            return str(int(v))
        return repr(v)
    if isinstance(v, (dict, list)):
        raise TemplateError("printing a map or list needs toYaml")
    return str(v)


def _to_yaml(v):
    if v is None:
        return "null"
    text = yaml.safe_dump(v, default_flow_style=False, sort_keys=True, width=1 << 30)
    if text.endswith("...\n"):
        text = text[:-4]
    return text.rstrip("\n")


def _indent(n, s):
    pad = " " * n
    return "\n".join(pad + line for line in s.split("\n"))


class Renderer:
    """Renders the templates of one chart; `templates` maps file names to their text."""

    def __init__(self, templates):
        self.defines = {}
        self.trees = {}
        for name in sorted(templates):
            tree = _parse(_lex(templates[name], name), name)
            self.trees[name] = tree
            self._collect_defines(tree, name)

    def _collect_defines(self, nodes, name):
        for node in nodes:
            if node[0] == "define":
                if node[1] in self.defines:
                    raise TemplateError(f"{name}: '{node[1]}' defined twice")
                self.defines[node[1]] = node[2]

    def render(self, name, root):
        return self._exec(self.trees[name], root, {"$": root}, 0)

    def _exec(self, nodes, dot, variables, depth):
        if depth > 50:
            raise TemplateError("include nests more than 50 deep")
        out = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "out":
                try:
                    out.append(_gostr(self._pipe(node[1], dot, variables, depth)))
                except TemplateError as e:
                    raise TemplateError(f"{node[2]}: {e}") from None
            elif kind == "if":
                for cond, body in node[1]:
                    if _truthy(self._pipe(cond, dot, variables, depth)):
                        out.append(self._exec(body, dot, variables, depth))
                        break
                else:
                    out.append(self._exec(node[2], dot, variables, depth))
            elif kind == "range":
                _, names, pipe, body, else_body = node
                seq = self._pipe(pipe, dot, variables, depth)
                if isinstance(seq, dict):
                    items = sorted(seq.items())  # Go ranges over maps in key order
                elif isinstance(seq, list):
                    items = list(enumerate(seq))
                elif seq is None:
                    items = []
                else:
                    raise TemplateError(f"range over {type(seq).__name__}")
                if not items:
                    out.append(self._exec(else_body, dot, variables, depth))
                for k, v in items:
                    scope = dict(variables)
                    if len(names) == 1:
                        scope[names[0]] = v
                    elif len(names) == 2:
                        scope[names[0]], scope[names[1]] = k, v
                    out.append(self._exec(body, v, scope, depth))
            # "define" produces nothing where it stands
        return "".join(out)

    def _pipe(self, cmds, dot, variables, depth):
        value = _NOTHING
        for cmd in cmds:
            value = self._command(cmd, dot, variables, depth, value)
        return value

    def _arg(self, op, dot, variables, depth):
        kind = op[0]
        if kind == "lit":
            return op[1]
        if kind == "pipe":
            return self._pipe(op[1], dot, variables, depth)
        if kind == "field":
            base, path = op[1], op[2]
            if base == ".":
                v = dot
            elif base in variables:
                v = variables[base]
            else:
                raise TemplateError(f"undefined variable {base}")
            walked = "" if base == "." else base
            for p in path:
                if v is None:
                    raise TemplateError(f"nil pointer evaluating {walked}.{p}")
                if not isinstance(v, dict):
                    raise TemplateError(f"cannot read field {p} of {walked}")
                v = v.get(p)
                walked += "." + p
            return v
        raise TemplateError(f"function {op[1]} used as a value")

    def _command(self, cmd, dot, variables, depth, piped):
        head = cmd[0]
        if head[0] != "func":
            if len(cmd) > 1 or piped is not _NOTHING:
                raise TemplateError("only a function takes arguments")
            return self._arg(head, dot, variables, depth)
        args = [self._arg(a, dot, variables, depth) for a in cmd[1:]]
        if piped is not _NOTHING:
            args.append(piped)
        return self._call(head[1], args, depth)

    def _call(self, fn, args, depth):
        def need(n):
            if len(args) != n:
                raise TemplateError(f"{fn} takes {n} argument(s), got {len(args)}")

        if fn == "include":
            need(2)
            if args[0] not in self.defines:
                raise TemplateError(f"no template named '{args[0]}'")
            return self._exec(self.defines[args[0]], args[1], {"$": args[1]}, depth + 1)
        if fn == "quote":
            return " ".join('"' + _gostr(a).replace("\\", "\\\\").replace('"', '\\"') + '"'
                            for a in args if a is not None)
        if fn == "default":
            need(2)
            return args[1] if _truthy(args[1]) else args[0]
        if fn == "toYaml":
            need(1)
            return _to_yaml(args[0])
        if fn in ("nindent", "indent"):
            need(2)
            if not isinstance(args[0], int):
                raise TemplateError(f"{fn} takes a number of spaces first")
            text = _indent(args[0], _gostr(args[1]))
            return "\n" + text if fn == "nindent" else text
        if fn == "required":
            need(2)
            if args[1] is None or args[1] == "":
                raise TemplateError(str(args[0]))
            return args[1]
        if fn in ("eq", "ne"):
            need(2)
            a, b = args
            if isinstance(a, bool) != isinstance(b, bool):
                raise TemplateError(f"{fn}: incompatible types for comparison")
            same = a == b
            return same if fn == "eq" else not same
        if fn == "not":
            need(1)
            return not _truthy(args[0])
        if fn == "and":
            if not args:
                raise TemplateError("and takes arguments")
            for a in args:
                if not _truthy(a):
                    return a
            return args[-1]
        if fn == "or":
            if not args:
                raise TemplateError("or takes arguments")
            for a in args:
                if _truthy(a):
                    return a
            return args[-1]
        raise TemplateError(f"function '{fn}' is outside the supported template subset")


_NOTHING = object()
