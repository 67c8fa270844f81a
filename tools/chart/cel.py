"""An evaluator for the part of CEL that our CRDs' x-kubernetes-validations rules use, so the
rules are exercised without an API server.

Covered: literals (int, double, 'string', "string", true, false, null), self and field selection,
has(), size(), string(), int(), quantity(), isQuantity(), the Quantity members compareTo,
isGreaterThan and isLessThan, ! && || ?:, == != < <= > >=, parentheses. A rule outside this
subset is refused when parsed, so every rule in deploy/crds/ is known to be evaluated here.
Errors follow CEL: selecting a field that is absent is an error (guard it with has()); && and ||
absorb an error when the other side decides the result.

Quantities follow Kubernetes' resource.Quantity grammar (decimal and binary suffixes, exponents).
"""

import re
from fractions import Fraction


class CelError(Exception):
    pass


_QUANTITY = re.compile(
    r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]+))?$")
_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10),
           "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
           "Pi": Fraction(2**50), "Ei": Fraction(2**60)}


def parse_quantity(text):
    """The exact value of a Kubernetes quantity string, or None when it is not one."""
    if not isinstance(text, str):
        return None
    m = _QUANTITY.match(text)
    if not m:
        return None
    value = Fraction(m.group(2)) * _SUFFIX[m.group(3) or ""]
    if m.group(4):
        value *= Fraction(10) ** int(m.group(4))
    return -value if m.group(1) == "-" else value


class Quantity:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Quantity) and self.value == other.value


_TOKEN = re.compile(r"""\s*(?:
    (?P<num>[0-9]+\.[0-9]+|[0-9]+)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>==|!=|<=|>=|&&|\|\||[<>!?:().,\[\]])
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
)""", re.X)


def _tokens(src):
    pos = 0
    out = []
    src = src.rstrip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise CelError(f"cannot parse rule at '{src[pos:]}'")
        pos = m.end()
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
    out.append(("end", None))
    return out


_FUNCTIONS = {"has", "size", "string", "int", "quantity", "isQuantity"}
_METHODS = {"compareTo", "isGreaterThan", "isLessThan", "size"}


class _Parser:
    def __init__(self, src):
        self.toks = _tokens(src)
        self.i = 0

    def peek(self):
        return self.toks[self.i]

    def take(self, value=None):
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            raise CelError(f"expected '{value}', found '{tok[1]}'")
        self.i += 1
        return tok

    def parse(self):
        node = self.expr()
        if self.peek()[0] != "end":
            raise CelError(f"unexpected '{self.peek()[1]}'")
        return node

    def expr(self):
        cond = self.or_()
        if self.peek()[1] == "?":
            self.take("?")
            a = self.expr()
            self.take(":")
            b = self.expr()
            return ("?:", cond, a, b)
        return cond

    def or_(self):
        node = self.and_()
        while self.peek()[1] == "||":
            self.take()
            node = ("||", node, self.and_())
        return node

    def and_(self):
        node = self.rel()
        while self.peek()[1] == "&&":
            self.take()
            node = ("&&", node, self.rel())
        return node

    def rel(self):
        node = self.unary()
        if self.peek()[1] in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take()[1]
            node = (op, node, self.unary())
        return node

    def unary(self):
        if self.peek()[1] == "!":
            self.take()
            return ("!", self.unary())
        return self.member()

    def member(self):
        node = self.primary()
        while self.peek()[1] == ".":
            self.take()
            kind, name = self.take()
            if kind != "id":
                raise CelError(f"expected a field name after '.', found '{name}'")
            if self.peek()[1] == "(":
                if name not in _METHODS:
                    raise CelError(f"method '{name}' is outside the supported CEL subset")
                node = ("method", name, node, self.args())
            else:
                node = ("select", node, name)
        return node

    def args(self):
        self.take("(")
        out = []
        if self.peek()[1] != ")":
            out.append(self.expr())
            while self.peek()[1] == ",":
                self.take()
                out.append(self.expr())
        self.take(")")
        return out

    def primary(self):
        kind, value = self.take()
        if kind == "num":
            return ("lit", float(value) if "." in value else int(value))
        if kind == "str":
            return ("lit", bytes(value[1:-1], "utf-8").decode("unicode_escape"))
        if value == "(":
            node = self.expr()
            self.take(")")
            return node
        if kind == "id":
            if value in ("true", "false"):
                return ("lit", value == "true")
            if value == "null":
                return ("lit", None)
            if self.peek()[1] == "(":
                if value not in _FUNCTIONS:
                    raise CelError(f"function '{value}' is outside the supported CEL subset")
                args = self.args()
                if value == "has" and (len(args) != 1 or args[0][0] != "select"):
                    raise CelError("has() takes one field selection")
                return ("call", value, args)
            if value != "self":
                raise CelError(f"unknown identifier '{value}'")
            return ("self",)
        raise CelError(f"unexpected '{value}'")


def compile_rule(src):
    """Parses a rule; raises CelError when it is outside the subset or malformed."""
    return _Parser(src).parse()


def _eval(node, self_value):
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "self":
        return self_value
    if kind == "select":
        obj = _eval(node[1], self_value)
        if not isinstance(obj, dict) or node[2] not in obj:
            raise CelError(f"no such key: {node[2]}")
        return obj[node[2]]
    if kind == "!":
        v = _eval(node[1], self_value)
        if not isinstance(v, bool):
            raise CelError("! takes a bool")
        return not v
    if kind in ("&&", "||"):
        results = []
        for side in (node[1], node[2]):
            try:
                v = _eval(side, self_value)
                if not isinstance(v, bool):
                    raise CelError(f"{kind} takes bools")
            except CelError as e:
                v = e
            results.append(v)
            decisive = (v is False) if kind == "&&" else (v is True)
            if decisive:
                return v
        for v in results:
            if isinstance(v, CelError):
                raise v
        return results[1]
    if kind == "?:":
        cond = _eval(node[1], self_value)
        if not isinstance(cond, bool):
            raise CelError("?: takes a bool condition")
        return _eval(node[2] if cond else node[3], self_value)
    if kind in ("==", "!=", "<", "<=", ">", ">="):
        a = _eval(node[1], self_value)
        b = _eval(node[2], self_value)
        if kind in ("==", "!="):
            same = a == b and isinstance(a, bool) == isinstance(b, bool)
            return same if kind == "==" else not same
        numeric = (int, float)
        if isinstance(a, bool) or isinstance(b, bool):
            raise CelError(f"no ordering for bools in {kind}")
        if not ((isinstance(a, numeric) and isinstance(b, numeric)) or
                (isinstance(a, str) and isinstance(b, str))):
            raise CelError(f"no such overload: {type(a).__name__} {kind} {type(b).__name__}")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[kind]
    if kind == "call":
        name, args = node[1], node[2]
        if name == "has":
            sel = args[0]
            obj = _eval(sel[1], self_value)
            if not isinstance(obj, dict):
                raise CelError("has() on something that is not an object")
            return sel[2] in obj
        values = [_eval(a, self_value) for a in args]
        if len(values) != 1:
            raise CelError(f"{name}() takes one argument")
        v = values[0]
        if name == "size":
            if not isinstance(v, (str, list, dict)):
                raise CelError("size() of something without a size")
            return len(v)
        if name == "string":
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise CelError("string() of an unsupported type")
            return v if isinstance(v, str) else str(v)
        if name == "int":
            if isinstance(v, bool):
                raise CelError("int() of a bool")
            try:
                return int(v)
            except (TypeError, ValueError):
                raise CelError(f"int() cannot convert {v!r}") from None
        if name == "isQuantity":
            if not isinstance(v, str):
                raise CelError("isQuantity() takes a string")
            return parse_quantity(v) is not None
        if name == "quantity":
            q = parse_quantity(v) if isinstance(v, str) else None
            if q is None:
                raise CelError(f"quantity() of an invalid quantity {v!r}")
            return Quantity(q)
    if kind == "method":
        name, target, args = node[1], _eval(node[2], self_value), node[3]
        values = [_eval(a, self_value) for a in args]
        if name == "size":
            if values or not isinstance(target, (str, list, dict)):
                raise CelError("size() of something without a size")
            return len(target)
        if not isinstance(target, Quantity) or len(values) != 1 or \
                not isinstance(values[0], Quantity):
            raise CelError(f"{name}() compares two quantities")
        a, b = target.value, values[0].value
        if name == "compareTo":
            return (a > b) - (a < b)
        return a > b if name == "isGreaterThan" else a < b
    raise CelError(f"cannot evaluate {kind}")


def evaluate(rule, self_value):
    """True when the rule holds for self_value; raises CelError on an evaluation error (which the
    API server reports as a failed validation too)."""
    result = _eval(compile_rule(rule), self_value)
    if not isinstance(result, bool):
        raise CelError("a rule must evaluate to a bool")
    return result
