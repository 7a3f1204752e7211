#!/usr/bin/env python3
"""Generates mqgrad's typed messages in C from proto/mqgrad.proto, the one model.

A message whose `message` line ends in `// c: TYPE_t` becomes a C struct named TYPE_t, of a
fixed size but for its [grow] fields (below), with, for the wire module only:

  TYPE_to_pb(const TYPE_t *c, s_TYPE_pbx *x)      the protobuf-c struct (in X's storage)
                                                    pointing at C's fields
  TYPE_from_pb(const Mqgrad__X *pb, TYPE_t *c)    copies in and validates; returns an
                                                    mq_drop_t and sets the error (mq_err_set)
                                                    (with [grow] fields, a third argument: the
                                                    mq_msg_t whose storage takes them)

Meta's `oneof body` is the list of message types, once: each entry `Body name = N;` is the
type MQ_MSG_NAME ("name" in logs, '_' written '-'), whose body is the member NAME of mq_msg_t
(C keywords get a trailing '_', as protobuf-c does). The header gets MQ_MSG_TYPES(X), the
body members; the wire module a packer and an unpacker that switch on the type.

Field annotations, in a field's trailing comment:
  [max N]    a string's bytes with its NUL, or a repeated field's entries (N: a number or a C
             constant); required on strings and repeated fields but [grow] ones. More is
             refused (MQ_DROP_TOO_MANY), never cut.
  [grow]     a repeated field of as many entries as the run has (a member set: as many as its
             workers; the servers' endpoints): C gets a count and a pointer, `uint32_t n_NAME;
             T *NAME` (a string: `char (*NAME)[L]`). Sent, the pointer is the sender's array;
             received, the entries are in the message's own storage (mq_msg_t, grown to the
             largest such message it took), valid as its payloads are, and mq_msg_copy copies
             them. Only the meta frame's size bounds them. Top-level bodies only.
  [len L]    a repeated string's bytes each, with its NUL.
  [fixed N]  bytes of exactly N when present: C gets `bool has_NAME; uint8_t NAME[N]`.
  [set N]    a repeated uint32 in strictly increasing order, each below N (a rank set:
             receivers search it and count it as a set); otherwise MQ_DROP_RANK. [set]: no bound
             but the order.
  [pairs F]  a repeated field with one entry per entry of F, or none (MQ_DROP_RANK).
  [req]      a string, bytes, message or list that must be there (MQ_DROP_GARBAGE).
  [any]      a double or float that may be non-finite (otherwise one is refused,
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
C_KEYWORDS = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch",
    "typedef", "union", "unsigned", "void", "volatile", "while", "bool",
}


def c_name(name):
    return name + "_" if name in C_KEYWORDS else name


def snake(name):
    """RunConfig -> run_config (protobuf-c's lower-case names)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Field:
    def __init__(self, label, ptype, name, comment):
        self.repeated = label == "repeated"
        self.ptype = ptype
        self.name = name
        self.cname = c_name(name)

        def opt(key):
            m = re.search(r"\[%s ([A-Za-z0-9_]+)\]" % key, comment)
            return m.group(1) if m else None

        self.max = opt("max")
        self.len = opt("len")
        self.fixed = opt("fixed")
        self.set = opt("set") or ("set" if "[set]" in comment else None)
        self.grow = "[grow]" in comment
        self.pairs = opt("pairs")
        self.req = "[req]" in comment
        self.any = "[any]" in comment
        self.doc = re.sub(r"\s*\[(\w+ [A-Za-z0-9_]+|req|any|grow|set)\]", "", comment).strip()


class Message:
    def __init__(self, name, ctype):
        self.name = name
        self.ctype = ctype
        self.fields = []
        self.body = []  # Meta's oneof body: (field name, message name)

    @property
    def fn(self):
        return self.ctype[:-2] if self.ctype.endswith("_t") else self.ctype

    @property
    def pb(self):
        return "Mqgrad__" + self.name

    @property
    def grows(self):
        return any(f.grow for f in self.fields)

    def elem_size(self, f):
        """The C bytes of one entry of the [grow] field F."""
        return f"{f.len}" if f.ptype == "string" else f"sizeof({SCALARS[f.ptype]})"


def parse(path):
    messages = {}
    order = []
    cur = None
    depth = 0
    in_oneof = False
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            code, _, comment = raw.partition("//")
            code = code.strip()
            if cur is None:
                m = re.match(r"message\s+(\w+)\s*\{\s*(\})?", code)
                if m:
                    c = re.search(r"\bc:\s*(\w+)", comment)
                    cur = Message(m.group(1), c.group(1) if c else None)
                    depth = 1
                    if m.group(2):  # message X {}
                        messages[cur.name] = cur
                        order.append(cur.name)
                        cur = None
                continue
            if re.match(r"oneof\s+body\s*\{", code):
                in_oneof = True
                depth += 1
                continue
            depth += code.count("{") - code.count("}")
            if in_oneof and depth == 1:
                in_oneof = False
                continue
            if depth <= 0:
                messages[cur.name] = cur
                order.append(cur.name)
                cur = None
                continue
            if depth > 2 or not code or code.startswith(("reserved", "option")):
                continue
            m = re.match(r"(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*\d+\s*;", code)
            if not m:
                sys.exit(f"{path}:{lineno}: cannot read this field: {code}")
            if in_oneof:
                cur.body.append((m.group(3), m.group(2)))
            else:
                label = "repeated" if m.group(1) else ""
                cur.fields.append(Field(label, m.group(2), m.group(3), comment))
    return messages, order


def c_members(msgs, m, f):
    """The struct members for F."""
    where = f"{m.name}.{f.name}"
    n = f.cname
    if f.grow:
        if not f.repeated or f.ptype not in list(SCALARS) + ["string"]:
            sys.exit(f"{where}: [grow] is for repeated scalars and strings")
        if f.ptype == "string":
            if not f.len:
                sys.exit(f"{where}: a repeated string needs [len L]")
            return [f"uint32_t n_{n};", f"char (*{n})[{f.len}];"]
        return [f"uint32_t n_{n};", f"{SCALARS[f.ptype]} *{n};"]
    if f.ptype == "string":
        if f.repeated:
            if not (f.max and f.len):
                sys.exit(f"{where}: a repeated string needs [max N] and [len L]")
            return [f"uint32_t n_{n};", f"char {n}[{f.max}][{f.len}];"]
        if not f.max:
            sys.exit(f"{where}: a string needs [max N]")
        return [f"char {n}[{f.max}];"]
    if f.ptype == "bytes":
        if f.repeated or not f.fixed:
            sys.exit(f"{where}: bytes need [fixed N] and cannot be repeated")
        return [f"bool has_{n};", f"uint8_t {n}[{f.fixed}];"]
    if f.ptype in SCALARS:
        if f.repeated:
            if not f.max:
                sys.exit(f"{where}: a repeated field needs [max N]")
            return [f"uint32_t n_{n};", f"{SCALARS[f.ptype]} {n}[{f.max}];"]
        return [f"{SCALARS[f.ptype]} {n};"]
    sub = msgs.get(f.ptype)
    if sub and sub.ctype and not f.repeated:
        return [f"{sub.ctype} {n};"]
    sys.exit(f"{where}: type {f.ptype} has no C struct (mark its message `// c: TYPE_t`)")


def c_messages(msgs, order):
    return [msgs[n] for n in order if msgs[n].ctype]


def gen_header(msgs, order, out):
    w = out.write
    w("/* Generated from proto/mqgrad.proto by proto/gen_c.py: edit the proto, not this file.\n")
    w(" * The comments are the proto's. */\n")
    w("#ifndef MQGRAD_MSGS_H\n#define MQGRAD_MSGS_H\n\n")
    w("#include <stdbool.h>\n#include <stdint.h>\n\n")
    for m in c_messages(msgs, order):
        if not m.fields:
            continue
        w(f"/* proto/mqgrad.proto's {m.name} */\ntypedef struct {{\n")
        for f in m.fields:
            lines = c_members(msgs, m, f)
            for i, line in enumerate(lines):
                doc = f" /* {f.doc} */" if f.doc and i == len(lines) - 1 else ""
                w(f"    {line}{doc}\n")
        w(f"}} {m.ctype};\n\n")
    meta = msgs.get("Meta")
    if meta and meta.body:
        w("/* Every message type once, in the order of Meta's oneof body:\n")
        w(" * X(ID, \"name\", body member or none_) */\n#define MQ_MSG_TYPES(X) \\\n")
        for field, mtype in meta.body:
            member = c_name(field) if msgs[mtype].fields else "none_"
            w(f"    X({field.upper()}, \"{field.replace('_', '-')}\", {member}) \\\n")
        w("\n/* The bodies: one member of mq_msg_t's union per type that has fields */\n")
        w("#define MQ_MSG_BODY_MEMBERS \\\n")
        for field, mtype in meta.body:
            if msgs[mtype].fields:
                w(f"    {msgs[mtype].ctype} {c_name(field)}; \\\n")
        w("\n")
        w("struct mq_msg;\n\n")
        w("/* A service's handlers, one per message type it takes (NULL: it does not take that\n")
        w(" * type; mq_dispatch then returns false). Each gets the message (its envelope: sender,\n")
        w(" * iteration, payload frames) and, for a type with fields, its body. */\n")
        w("typedef struct {\n")
        for field, mtype in meta.body:
            cn = c_name(field)
            if msgs[mtype].fields:
                w(f"    void (*{cn})(void *self, struct mq_msg *msg, const {msgs[mtype].ctype} *body);\n")
            else:
                w(f"    void (*{cn})(void *self, struct mq_msg *msg);\n")
        w("} mq_handlers_t;\n\n")
    w("#endif\n")


def gen_pbx(msgs, m, w):
    """Storage for the protobuf-c struct of M and everything it points to."""
    w(f"typedef struct {{\n    {m.pb} pb;\n")
    for f in m.fields:
        if f.ptype == "string" and f.repeated and f.grow:
            w(f"    char **{f.cname};\n")
        elif f.ptype == "string" and f.repeated:
            w(f"    char *{f.cname}[{f.max}];\n")
        elif f.ptype not in SCALARS and f.ptype not in ("string", "bytes"):
            w(f"    s_{msgs[f.ptype].fn}_pbx {f.cname};\n")
    w(f"}} s_{m.fn}_pbx;\n\n")


def gen_to_pb(msgs, m, w):
    w(f"static {m.pb} *{m.fn}_to_pb(const {m.ctype} *c, s_{m.fn}_pbx *x)\n{{\n")
    w(f"    mqgrad__{snake(m.name)}__init(&x->pb);\n")
    if not m.fields:
        w("    (void)c;\n")
    for f in m.fields:
        n, pn = f.cname, f.cname
        if f.grow and f.ptype == "string":
            w(f"    if (c->n_{n} && !(x->{n} = s_gen_strv(c->n_{n})))\n")
            w("        return NULL;\n")
            w(f"    x->pb.n_{pn} = c->n_{n};\n")
            w(f"    for (size_t i = 0; i < x->pb.n_{pn}; i++)\n")
            w(f"        x->{n}[i] = (char *)c->{n}[i];\n")
            w(f"    x->pb.{pn} = x->{n};\n")
        elif f.grow:
            w(f"    x->pb.n_{pn} = c->n_{n};\n")
            w(f"    x->pb.{pn} = ({SCALARS[f.ptype]} *)c->{n};\n")
        elif f.ptype == "string" and f.repeated:
            w(f"    x->pb.n_{pn} = c->n_{n} > {f.max} ? {f.max} : c->n_{n};\n")
            w(f"    for (size_t i = 0; i < x->pb.n_{pn}; i++)\n")
            w(f"        x->{n}[i] = (char *)c->{n}[i];\n")
            w(f"    x->pb.{pn} = x->{n};\n")
        elif f.ptype == "string":
            w(f"    x->pb.{pn} = (char *)c->{n};\n")
        elif f.ptype == "bytes":
            w(f"    if (c->has_{n})\n")
            w(f"        x->pb.{pn} = (ProtobufCBinaryData){{.len = {f.fixed}, .data = (uint8_t *)c->{n}}};\n")
        elif f.ptype in SCALARS and f.repeated:
            w(f"    x->pb.n_{pn} = c->n_{n} > {f.max} ? {f.max} : c->n_{n};\n")
            w(f"    x->pb.{pn} = ({SCALARS[f.ptype]} *)c->{n};\n")
        elif f.ptype in SCALARS:
            w(f"    x->pb.{pn} = c->{n};\n")
        else:
            w(f"    x->pb.{pn} = {msgs[f.ptype].fn}_to_pb(&c->{n}, &x->{n});\n")
    w("    return &x->pb;\n}\n\n")


def gen_from_pb(msgs, m, w):
    store = ", mq_msg_t *msg" if m.grows else ""
    w(f"static mq_drop_t {m.fn}_from_pb(const {m.pb} *pb, {m.ctype} *c{store})\n{{\n")
    if not m.fields:
        w("    (void)pb;\n    (void)c;\n    return MQ_DROP_NONE;\n}\n\n")
        return
    w("    memset(c, 0, sizeof *c);\n")
    if m.grows:  # room for every [grow] field at once, then each takes its part
        w("    size_t need = 0;\n")
        for f in m.fields:
            if f.grow:
                w(f"    need += s_gen_round(pb->n_{f.cname} * {m.elem_size(f)});\n")
        w("    unsigned char *room = s_gen_room(msg, need);\n")
        w("    if (need && !room) {\n")
        w(f"        mq_err_set(\"{m.name}: no memory for %zu bytes of lists\", need);\n")
        w("        return MQ_DROP_TOO_MANY;\n    }\n")
        for f in m.fields:
            if f.grow:
                w(f"    c->{f.cname} = pb->n_{f.cname} ? (void *)room : NULL; /* none: NULL */\n")
                w(f"    room += s_gen_round(pb->n_{f.cname} * {m.elem_size(f)});\n")
    for f in m.fields:
        n, pn = f.cname, f.cname
        where = f"{m.name}.{f.name}"

        def refuse(cond, drop, fmt, *args):
            a = "".join(", " + x for x in args)
            w(f"    if ({cond}) {{\n        mq_err_set(\"{fmt}\"{a});\n")
            w(f"        return {drop};\n    }}\n")

        if f.req:
            if f.repeated:
                missing = f"pb->n_{pn} == 0"
            elif f.ptype == "string":
                missing = f"!pb->{pn} || !pb->{pn}[0]"
            elif f.ptype == "bytes":
                missing = f"pb->{pn}.len == 0"
            else:
                missing = f"!pb->{pn}"
            refuse(missing, "MQ_DROP_GARBAGE", f"{where} is missing")
        if f.repeated:
            if not f.grow:
                refuse(f"pb->n_{pn} > {f.max}", "MQ_DROP_TOO_MANY",
                       f"{where}: %zu entries, at most %d", f"pb->n_{pn}", f"(int){f.max}")
            if f.pairs:
                refuse(f"pb->n_{pn} != 0 && pb->n_{pn} != pb->n_{c_name(f.pairs)}",
                       "MQ_DROP_RANK" if f.pairs == "members" else "MQ_DROP_LAYOUT",
                       f"{where}: %zu entries for %zu {f.pairs}",
                       f"pb->n_{pn}", f"pb->n_{c_name(f.pairs)}")
            w(f"    c->n_{n} = (uint32_t)pb->n_{pn};\n")
            w(f"    for (size_t i = 0; i < pb->n_{pn}; i++) {{\n")
            if f.ptype == "string":
                w(f"        if (!s_gen_str(c->{n}[i], sizeof c->{n}[i], pb->{pn}[i], \"{where}\"))\n")
                w("            return MQ_DROP_TOO_MANY;\n    }\n")
                continue
            if f.ptype in ("double", "float") and not f.any:
                w(f"        if (!isfinite(pb->{pn}[i])) {{\n")
                w(f"            mq_err_set(\"{where}[%zu] is not finite\", i);\n")
                w("            return MQ_DROP_NONFINITE;\n        }\n")
            if f.set == "set":
                w(f"        if (i > 0 && pb->{pn}[i] <= pb->{pn}[i - 1]) {{\n")
                w(f"            mq_err_set(\"{where}: not in strictly increasing order\");\n")
                w("            return MQ_DROP_RANK;\n        }\n")
            elif f.set:
                w(f"        if (pb->{pn}[i] >= {f.set} || (i > 0 && pb->{pn}[i] <= pb->{pn}[i - 1])) {{\n")
                w(f"            mq_err_set(\"{where}: not in strictly increasing order below %d\", (int){f.set});\n")
                w("            return MQ_DROP_RANK;\n        }\n")
            w(f"        c->{n}[i] = pb->{pn}[i];\n    }}\n")
        elif f.ptype == "string":
            w(f"    if (!s_gen_str(c->{n}, sizeof c->{n}, pb->{pn}, \"{where}\"))\n")
            w("        return MQ_DROP_TOO_MANY;\n")
        elif f.ptype == "bytes":
            refuse(f"pb->{pn}.len != 0 && pb->{pn}.len != {f.fixed}", "MQ_DROP_GARBAGE",
                   f"{where}: %zu bytes, %d expected", f"pb->{pn}.len", f"(int){f.fixed}")
            w(f"    c->has_{n} = pb->{pn}.len == {f.fixed};\n")
            w(f"    if (c->has_{n})\n        memcpy(c->{n}, pb->{pn}.data, {f.fixed});\n")
        elif f.ptype in SCALARS:
            if f.ptype in ("double", "float") and not f.any:
                refuse(f"!isfinite(pb->{pn})", "MQ_DROP_NONFINITE", f"{where} is not finite")
            w(f"    c->{n} = pb->{pn};\n")
        else:
            sub = msgs[f.ptype]
            w(f"    if (pb->{pn}) {{\n")
            w(f"        mq_drop_t d = {sub.fn}_from_pb(pb->{pn}, &c->{n});\n")
            w("        if (d != MQ_DROP_NONE)\n            return d;\n    }\n")
    w("    return MQ_DROP_NONE;\n}\n\n")


def gen_body(msgs, meta, w):
    """Packs and unpacks mq_msg_t's body by its type."""
    w("typedef union {\n")
    for field, mtype in meta.body:
        if msgs[mtype].fields:
            w(f"    s_{msgs[mtype].fn}_pbx {c_name(field)};\n")
    w("    char none_;\n} s_body_pbx;\n\n")
    w("/* Points META's body at MSG's, in X's storage. */\n")
    w("static int s_body_to_pb(const mq_msg_t *msg, s_body_pbx *x, Mqgrad__Meta *meta)\n{\n")
    w("    static Mqgrad__Empty empty = MQGRAD__EMPTY__INIT;\n")
    w("    switch (msg->type) {\n")
    for field, mtype in meta.body:
        mm = msgs[mtype]
        cn = c_name(field)
        w(f"    case MQ_MSG_{field.upper()}:\n")
        w(f"        meta->body_case = MQGRAD__META__BODY_{field.upper()};\n")
        if mm.fields:
            w(f"        meta->{cn} = {mm.fn}_to_pb(&msg->{cn}, &x->{cn});\n")
            if mm.grows:
                w(f"        if (!meta->{cn}) {{\n            mq_err_set(\"out of memory\");\n")
                w("            return -1;\n        }\n")
        else:
            w(f"        meta->{cn} = &empty;\n")
        w("        return 0;\n")
    w("    default:\n        mq_err_set(\"message type %d has no body\", (int)msg->type);\n")
    w("        return -1;\n    }\n}\n\n")
    w("/* MSG's type and body from META's; MQ_DROP_TYPE when it has none this side knows. */\n")
    w("static mq_drop_t s_body_from_pb(const Mqgrad__Meta *meta, mq_msg_t *msg)\n{\n")
    w("    switch (meta->body_case) {\n")
    for field, mtype in meta.body:
        mm = msgs[mtype]
        cn = c_name(field)
        w(f"    case MQGRAD__META__BODY_{field.upper()}:\n")
        w(f"        msg->type = MQ_MSG_{field.upper()};\n")
        if mm.grows:
            w(f"        return {mm.fn}_from_pb(meta->{cn}, &msg->{cn}, msg);\n")
        elif mm.fields:
            w(f"        return {mm.fn}_from_pb(meta->{cn}, &msg->{cn});\n")
        else:
            w("        return MQ_DROP_NONE;\n")
    w("    default:\n        mq_err_set(\"a message without a body of a known type\");\n")
    w("        return MQ_DROP_TYPE;\n    }\n}\n\n")
    w("bool mq_dispatch(const mq_handlers_t *on, void *self, mq_msg_t *msg)\n{\n")
    w("    switch (msg->type) {\n")
    for field, mtype in meta.body:
        cn = c_name(field)
        w(f"    case MQ_MSG_{field.upper()}:\n        if (!on->{cn})\n            return false;\n")
        if msgs[mtype].fields:
            w(f"        on->{cn}(self, msg, &msg->{cn});\n")
        else:
            w(f"        on->{cn}(self, msg);\n")
        w("        return true;\n")
    w("    default:\n        return false;\n    }\n}\n\n")
    w("/* After MSG's envelope and body were copied from another message: its [grow] fields'\n")
    w(" * entries copied into MSG's own storage. -1 when it cannot grow. */\n")
    w("static int s_body_own(mq_msg_t *msg)\n{\n    size_t need = 0;\n")
    w("    unsigned char *room;\n    switch (msg->type) {\n")
    for field, mtype in meta.body:
        mm = msgs[mtype]
        if not mm.grows:
            continue
        cn = c_name(field)
        gf = [f for f in mm.fields if f.grow]
        w(f"    case MQ_MSG_{field.upper()}:\n")
        for f in gf:
            w(f"        need += s_gen_round(msg->{cn}.n_{f.cname} * {mm.elem_size(f)});\n")
        w("        if (!(room = s_gen_room(msg, need)) && need)\n            return -1;\n")
        for f in gf:
            x = f"msg->{cn}.{f.cname}"
            w(f"        if (msg->{cn}.n_{f.cname}) /* none: NULL, as received */\n")
            w(f"            memmove(room, {x}, msg->{cn}.n_{f.cname} * {mm.elem_size(f)});\n")
            w(f"        {x} = msg->{cn}.n_{f.cname} ? (void *)room : NULL;\n")
            w(f"        room += s_gen_round(msg->{cn}.n_{f.cname} * {mm.elem_size(f)});\n")
        w("        return 0;\n")
    w("    default:\n        (void)need, (void)room;\n        return 0;\n    }\n}\n\n")
    w("/* The bytes mq_msg_init clears for a message of TYPE: its body's. */\n")
    w("static size_t s_body_size(mq_msg_type_t type)\n{\n    switch (type) {\n")
    for field, mtype in meta.body:
        if msgs[mtype].fields:
            w(f"    case MQ_MSG_{field.upper()}:\n        return sizeof({msgs[mtype].ctype});\n")
    w("    default:\n        return 0;\n    }\n}\n\n")


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
    for m in c_messages(msgs, order):
        if not m.fields:
            continue
        gen_pbx(msgs, m, w)
        gen_to_pb(msgs, m, w)
        gen_from_pb(msgs, m, w)
    meta = msgs.get("Meta")
    if meta and meta.body:
        gen_body(msgs, meta, w)


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
