#!/usr/bin/env python3
"""Generates mqgrad's plain C message structs from proto/mqgrad.proto, the one model.

A message whose `message` line ends in `// c: TYPE_t` becomes a fixed-size C struct named
TYPE_t (no pointers: it copies by value, lives in other structs and outlives any receive),
with two functions:

  TYPE_to_pb(const TYPE_t *c, Mqgrad__X *pb)    points the protobuf-c struct at C's fields
  TYPE_from_pb(const Mqgrad__X *pb, TYPE_t *c)  copies in and validates; returns an
                                                 mq_drop_t and sets the error (mq_err_set)

Field annotations, in a field's trailing comment:
  [max N]   a string's bytes with its NUL, or a repeated field's entries (N: a number or a C
            constant); required on strings and repeated fields. More is refused
            (MQ_DROP_TOO_MANY), never cut.
  [any]     a double or float that may be non-finite (otherwise one is refused,
            MQ_DROP_NONFINITE, naming the field).
Received strings have every control character turned into '?': what a peer writes lands
in logs and files, where it must not forge lines or drive a terminal.

Usage: gen_c.py PROTO OUT_H OUT_INC. OUT_H holds the structs (services include it through
mqgrad/wire.h); OUT_INC the functions, included by the wire module only (the one file that
knows protobuf)."""
import re
import sys

SCALARS = {
    "double": "double",
    "float": "float",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "bool": "bool",
}


def snake_pb(name):
    """protobuf-c's C name for a message: Mqgrad__RunConfig; its init macro
    MQGRAD__RUN_CONFIG__INIT."""
    return "Mqgrad__" + name


class Field:
    def __init__(self, label, ptype, name, comment):
        self.repeated = label == "repeated"
        self.ptype = ptype
        self.name = name
        m = re.search(r"\[max ([A-Za-z0-9_]+)\]", comment)
        self.max = m.group(1) if m else None
        self.any = "[any]" in comment
        self.doc = re.sub(r"\s*\[(max [A-Za-z0-9_]+|any)\]", "", comment).strip()


class Message:
    def __init__(self, name, ctype):
        self.name = name
        self.ctype = ctype
        self.fields = []


def parse(path):
    messages = {}
    order = []
    cur = None
    depth = 0
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            code, _, comment = raw.partition("//")
            code = code.strip()
            if cur is None:
                m = re.match(r"message\s+(\w+)\s*\{", code)
                if m:
                    c = re.search(r"\bc:\s*(\w+)", comment)
                    cur = Message(m.group(1), c.group(1) if c else None)
                    depth = 1
                continue
            depth += code.count("{") - code.count("}")
            if depth <= 0:
                messages[cur.name] = cur
                order.append(cur.name)
                cur = None
                continue
            if depth > 1 or not code or code.startswith(("reserved", "oneof", "option")):
                continue
            m = re.match(r"(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*\d+\s*;", code)
            if not m:
                sys.exit(f"{path}:{lineno}: cannot read this field: {code}")
            label = "repeated" if m.group(1) else ""
            cur.fields.append(Field(label, m.group(2), m.group(3), comment))
    return messages, order


def c_field(msgs, m, f):
    """The struct member for F, and its comment."""
    where = f"{m.name}.{f.name}"
    if f.ptype == "string":
        if f.repeated or not f.max:
            sys.exit(f"{where}: a string needs [max N] and cannot be repeated here")
        return [f"char {f.name}[{f.max}];"]
    if f.ptype in SCALARS:
        if f.repeated:
            if not f.max:
                sys.exit(f"{where}: a repeated field needs [max N]")
            return [f"uint32_t n_{f.name};", f"{SCALARS[f.ptype]} {f.name}[{f.max}];"]
        return [f"{SCALARS[f.ptype]} {f.name};"]
    sub = msgs.get(f.ptype)
    if sub and sub.ctype and not f.repeated:
        return [f"{sub.ctype} {f.name};"]
    sys.exit(f"{where}: type {f.ptype} has no C struct (mark its message `// c: TYPE_t`)")


def gen_header(msgs, order, out):
    w = out.write
    w("/* Generated from proto/mqgrad.proto by proto/gen_c.py: edit the proto, not this file.\n")
    w(" * The comments are the proto's. */\n")
    w("#ifndef MQGRAD_MSGS_H\n#define MQGRAD_MSGS_H\n\n")
    w("#include <stdbool.h>\n#include <stdint.h>\n\n")
    for name in order:
        m = msgs[name]
        if not m.ctype:
            continue
        w(f"/* proto/mqgrad.proto's {m.name} */\ntypedef struct {{\n")
        for f in m.fields:
            lines = c_field(msgs, m, f)
            for i, line in enumerate(lines):
                doc = f" /* {f.doc} */" if f.doc and i == len(lines) - 1 else ""
                w(f"    {line}{doc}\n")
        w(f"}} {m.ctype};\n\n")
    w("#endif\n")


def gen_inc(msgs, order, out):
    w = out.write
    w("/* Generated from proto/mqgrad.proto by proto/gen_c.py: edit the proto, not this file.\n")
    w(" * Included by the wire module only, after mqgrad/wire.h and the protobuf-c header. */\n\n")
    w("static bool s_gen_str(char *dst, size_t cap, const char *src, const char *what)\n{\n")
    w("    size_t n = src ? strlen(src) : 0;\n")
    w("    if (n >= cap) {\n")
    w("        mq_err_set(\"%s: %zu bytes, at most %zu\", what, n, cap - 1);\n")
    w("        return false;\n    }\n")
    w("    memcpy(dst, src ? src : \"\", n + 1);\n")
    w("    for (char *p = dst; *p; p++)\n")
    w("        if ((unsigned char)*p < 0x20 || *p == 0x7f)\n")
    w("            *p = '?';\n")
    w("    return true;\n}\n\n")
    for name in order:
        m = msgs[name]
        if not m.ctype:
            continue
        pb = snake_pb(m.name)
        fn = m.ctype[:-2] if m.ctype.endswith("_t") else m.ctype
        # to protobuf: pointers into C's fields; nested messages need storage of their own
        nested = [f for f in m.fields if f.ptype not in SCALARS and f.ptype != "string"]
        w(f"static void {fn}_to_pb(const {m.ctype} *c, {pb} *pb")
        for f in nested:
            w(f", {snake_pb(f.ptype)} *{f.name}_pb")
        w(")\n{\n")
        for f in m.fields:
            if f.ptype == "string":
                w(f"    pb->{f.name} = (char *)c->{f.name};\n")
            elif f.ptype in SCALARS and f.repeated:
                w(f"    pb->n_{f.name} = c->n_{f.name} > {f.max} ? {f.max} : c->n_{f.name};\n")
                w(f"    pb->{f.name} = ({SCALARS[f.ptype]} *)c->{f.name};\n")
            elif f.ptype in SCALARS:
                w(f"    pb->{f.name} = c->{f.name};\n")
            else:
                sub = msgs[f.ptype]
                sfn = sub.ctype[:-2]
                w(f"    {sfn}_to_pb(&c->{f.name}, {f.name}_pb);\n")
                w(f"    pb->{f.name} = {f.name}_pb;\n")
        w("}\n\n")
        w(f"static mq_drop_t {fn}_from_pb(const {pb} *pb, {m.ctype} *c)\n{{\n")
        w("    memset(c, 0, sizeof *c);\n")
        for f in m.fields:
            where = f"{m.name}.{f.name}"
            if f.ptype == "string":
                w(f"    if (!s_gen_str(c->{f.name}, sizeof c->{f.name}, pb->{f.name}, \"{where}\"))\n")
                w("        return MQ_DROP_TOO_MANY;\n")
            elif f.ptype in SCALARS and f.repeated:
                w(f"    if (pb->n_{f.name} > {f.max}) {{\n")
                w(f"        mq_err_set(\"{where}: %zu entries, at most %d\", pb->n_{f.name}, (int){f.max});\n")
                w("        return MQ_DROP_TOO_MANY;\n    }\n")
                w(f"    c->n_{f.name} = (uint32_t)pb->n_{f.name};\n")
                w(f"    for (size_t i = 0; i < pb->n_{f.name}; i++) {{\n")
                if f.ptype in ("double", "float") and not f.any:
                    w(f"        if (!isfinite(pb->{f.name}[i])) {{\n")
                    w(f"            mq_err_set(\"{where}[%zu] is not finite\", i);\n")
                    w("            return MQ_DROP_NONFINITE;\n        }\n")
                w(f"        c->{f.name}[i] = pb->{f.name}[i];\n    }}\n")
            elif f.ptype in SCALARS:
                if f.ptype in ("double", "float") and not f.any:
                    w(f"    if (!isfinite(pb->{f.name})) {{\n")
                    w(f"        mq_err_set(\"{where} is not finite\");\n")
                    w("        return MQ_DROP_NONFINITE;\n    }\n")
                w(f"    c->{f.name} = pb->{f.name};\n")
            else:
                sfn = msgs[f.ptype].ctype[:-2]
                w(f"    if (pb->{f.name}) {{\n")
                w(f"        mq_drop_t d = {sfn}_from_pb(pb->{f.name}, &c->{f.name});\n")
                w("        if (d != MQ_DROP_NONE)\n            return d;\n    }\n")
        w("    return MQ_DROP_NONE;\n}\n\n")


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: gen_c.py PROTO OUT_H OUT_INC")
    msgs, order = parse(sys.argv[1])
    with open(sys.argv[2], "w", encoding="utf-8") as h:
        gen_header(msgs, order, h)
    with open(sys.argv[3], "w", encoding="utf-8") as inc:
        gen_inc(msgs, order, inc)


if __name__ == "__main__":
    main()
