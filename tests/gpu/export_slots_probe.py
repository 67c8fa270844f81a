# Native probe (GPU tier, no build needed): calls the undocumented export-table slots the remote
# stub emulates (TOOLS_TLS[2], CONTEXT_QUERIES[4], [51], [39]) on the real driver next to the
# public queries they were found to match (cuCtxGetId, cuStreamGetId), and the PCI bus-id forms
# cuDeviceGetByPCIBusId accepts. docs/export-tables.md records what driver 580 answered.
import ctypes as C, sys
cu = C.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0: print("ERR", what, r); 
    return r
u64 = C.c_uint64
cu.cuGetExportTable.argtypes = [C.POINTER(C.c_void_p), C.c_char_p]
def table(hexid):
    t = C.c_void_p()
    r = cu.cuGetExportTable(C.byref(t), bytes.fromhex(hexid))
    print("table", hexid[:8], "->", r)
    return C.cast(t, C.POINTER(C.c_void_p)) if r == 0 else None
def slot(t, i, restype, *argtypes):
    return C.CFUNCTYPE(restype, *argtypes)(t[i])
tls = table("42d85a8123f6cb478298f6e78a3aecdc")
print("tls size word", tls[0])
tls2 = slot(tls, 2, C.c_int, C.POINTER(C.c_void_p))
v = C.c_void_p(0x1234)
print("tls2 before cuInit", tls2(C.byref(v)), hex(v.value or 0))
ok(cu.cuInit(0), "init")
v = C.c_void_p(0x1234)
print("tls2 after init no ctx", tls2(C.byref(v)), v.value)
dev = C.c_int(); cu.cuDeviceGet(C.byref(dev), 0)
pctx = C.c_void_p(); ok(cu.cuDevicePrimaryCtxRetain(C.byref(pctx), dev), "retain")
ok(cu.cuCtxSetCurrent(pctx), "set")
v = C.c_void_p(0)
print("tls2 with primary", tls2(C.byref(v)), hex(v.value or 0), "primary", hex(pctx.value))
ctx2 = C.c_void_p(); ok(cu.cuCtxCreate_v2(C.byref(ctx2), 0, dev), "create")
v = C.c_void_p(0)
print("tls2 with created (pushed)", tls2(C.byref(v)), hex(v.value or 0), "created", hex(ctx2.value))
q = table("21318c60971432488ca641ff7324c8f2")
q4 = slot(q, 4, C.c_int, C.c_void_p, C.POINTER(u64))
for name, c in (("primary", pctx), ("created", ctx2), ("null", C.c_void_p(0))):
    o = u64(77); r = q4(c, C.byref(o))
    cid = u64(0); rr = cu.cuCtxGetId(c, C.byref(cid)) if c.value else -1
    print("q4", name, r, o.value, "cuCtxGetId", rr, cid.value)
cu.cuCtxSetCurrent(pctx)
q51 = slot(q, 51, C.c_int, C.c_void_p, C.c_void_p, C.POINTER(C.c_void_p), C.c_int)
q39 = slot(q, 39, C.c_int, C.c_void_p, C.c_void_p, C.POINTER(u64))
streams = [("null", C.c_void_p(0)), ("legacy", C.c_void_p(1)), ("perthread", C.c_void_p(2))]
for flags, prio in ((0, 0), (1, 0), (1, -1), (0, -5)):
    s = C.c_void_p(); ok(cu.cuStreamCreateWithPriority(C.byref(s), flags, prio), "stream")
    streams.append(("created f%d p%d" % (flags, prio), s))
for name, s in streams:
    for flag in (0, 1):
        obj = C.c_void_p(0); r = q51(pctx, s, C.byref(obj), flag)
        o = u64(0); r39 = q39(pctx, obj, C.byref(o)) if r == 0 else -1
        sid = u64(0); rid = cu.cuStreamGetId(s, C.byref(sid))
        pr = C.c_int(0); cu.cuStreamGetPriority(s, C.byref(pr))
        fl = C.c_uint(0); cu.cuStreamGetFlags(s, C.byref(fl))
        head = bytes((C.c_ubyte * 32).from_address(obj.value)).hex() if r == 0 and obj.value else ""
        print("q51", name, "flag", flag, "->", r, hex(obj.value or 0), "q39", r39, o.value,
              "| id", rid, sid.value, "prio", pr.value, "flags", fl.value, "| head", head)
o = C.c_void_p(0); print("q51 on ctx2 null stream", q51(ctx2, C.c_void_p(0), C.byref(o), 0), hex(o.value or 0))
print("q51 null out", q51(pctx, C.c_void_p(0), None, 0))
print("q51 stream -1", q51(pctx, C.c_void_p(-1 & (2**64-1)), C.byref(o), 0))
print("q39 null out", q39(pctx, o, None))
buf = C.create_string_buffer(64)
print("pcibusid", cu.cuDeviceGetPCIBusId(buf, 64, dev), buf.value)
print("pcibusid short", cu.cuDeviceGetPCIBusId(buf, 8, dev), buf.value)
bid = buf.value
cu.cuDeviceGetPCIBusId(buf, 64, dev); bid = buf.value.decode()
for form in (bid, bid.lower(), bid.upper(), bid.split(":",1)[1], bid[:-2], "0000:ff:1f.0", "junk", ""):
    d = C.c_int(-7); r = cu.cuDeviceGetByPCIBusId(C.byref(d), form.encode())
    print("bypci", repr(form), r, d.value)
for a in (33, 50, 34):
    x = C.c_int(); cu.cuDeviceGetAttribute(C.byref(x), a, dev); print("attr", a, x.value)
sc = C.c_void_p(); print("streamgetctx legacy", cu.cuStreamGetCtx(C.c_void_p(0), C.byref(sc)), hex(sc.value or 0))
sd = C.c_int(-1); print("streamgetdevice", cu.cuStreamGetDevice(C.c_void_p(0), C.byref(sd)), sd.value)
