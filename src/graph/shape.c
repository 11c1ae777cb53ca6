/* Shape rules. Each checks its operands and computes the result shape, or records an error that
 * names the caller's line, the op and the shapes involved. */
#include "graph/graph.h"

#include <stdio.h>

bool shape_valid(tg_graph *g, tg_site s, const char *op, tg_shape x) {
    char a[96];
    if (x.ndim < 0 || x.ndim > TG_MAX_DIMS) {
        ir_fail(g, s, "%s: rank %d is out of range (0..%d)", op, x.ndim, TG_MAX_DIMS);
        return false;
    }
    int64_t n = 1;
    for (int i = 0; i < x.ndim; i++) {
        if (x.d[i] <= 0) { ir_fail(g, s, "%s: shape %s has a dimension <= 0", op, shape_str(x, a)); return false; }
        if (n > INT64_MAX / 8 / x.d[i]) { ir_fail(g, s, "%s: shape %s is too large", op, shape_str(x, a)); return false; }
        n *= x.d[i];
    }
    return true;
}

bool shape_broadcast(tg_graph *g, tg_site s, const char *op, tg_shape a, tg_shape b, tg_shape *out) {
    tg_shape r = { a.ndim > b.ndim ? a.ndim : b.ndim, { 0 } };
    for (int i = 0; i < r.ndim; i++) {
        int ia = a.ndim - r.ndim + i, ib = b.ndim - r.ndim + i;
        int64_t da = ia >= 0 ? a.d[ia] : 1, db = ib >= 0 ? b.d[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[96], sb[96];
            ir_fail(g, s, "%s: %s and %s do not broadcast (axis %d: %lld vs %lld)", op, shape_str(a, sa),
                    shape_str(b, sb), i - r.ndim, (long long)da, (long long)db);
            return false;
        }
        r.d[i] = da == 1 ? db : da;
    }
    *out = r;
    return true;
}

bool shape_axis(tg_graph *g, tg_site s, const char *op, tg_shape x, int axis, int *out) {
    int a = axis < 0 ? axis + x.ndim : axis;
    if (a < 0 || a >= x.ndim) {
        char sx[96];
        ir_fail(g, s, "%s: axis %d is out of range for %s", op, axis, shape_str(x, sx));
        return false;
    }
    *out = a;
    return true;
}

bool shape_matmul(tg_graph *g, tg_site s, tg_shape a, tg_shape b, tg_shape *out) {
    char sa[96], sb[96];
    if (a.ndim < 2 || b.ndim < 2) {
        ir_fail(g, s, "tg_matmul: %s x %s: both operands need at least 2 dimensions", shape_str(a, sa), shape_str(b, sb));
        return false;
    }
    if (a.d[a.ndim - 1] != b.d[b.ndim - 2]) {
        ir_fail(g, s, "tg_matmul: %s x %s: inner dimensions differ (%lld vs %lld)", shape_str(a, sa),
                shape_str(b, sb), (long long)a.d[a.ndim - 1], (long long)b.d[b.ndim - 2]);
        return false;
    }
    tg_shape ba = a, bb = b, batch;
    ba.ndim -= 2;
    bb.ndim -= 2;
    if (!shape_broadcast(g, s, "tg_matmul (batch dimensions)", ba, bb, &batch)) return false;
    batch.d[batch.ndim++] = a.d[a.ndim - 2];
    batch.d[batch.ndim++] = b.d[b.ndim - 1];
    if (batch.ndim > TG_MAX_DIMS) { ir_fail(g, s, "tg_matmul: result has too many dimensions"); return false; }
    *out = batch;
    return true;
}

bool shape_attention(tg_graph *g, tg_site s, tg_shape q, tg_shape k, tg_shape v, tg_shape *out) {
    char sq[96], sk[96], sv[96];
    bool ok = q.ndim >= 2 && k.ndim == q.ndim && v.ndim == q.ndim;
    for (int i = 0; ok && i < q.ndim - 2; i++) ok = q.d[i] == k.d[i] && q.d[i] == v.d[i];
    const char *why = !ok ? "q, k and v need the same rank (at least 2) and the same leading dimensions"
                      : q.d[q.ndim - 1] != k.d[k.ndim - 1] ? "q and k need the same last dimension"
                      : k.d[k.ndim - 2] != v.d[v.ndim - 2] ? "k and v need the same number of rows"
                                                           : NULL;
    if (why) {
        ir_fail(g, s, "tg_attention: q %s, k %s, v %s: %s", shape_str(q, sq), shape_str(k, sk), shape_str(v, sv), why);
        return false;
    }
    *out = q;
    out->d[q.ndim - 1] = v.d[v.ndim - 1];
    return true;
}

bool shape_reshape(tg_graph *g, tg_site s, tg_shape x, tg_shape want, tg_shape *out) {
    char sx[96], sw[96];
    int infer = -1;
    int64_t known = 1;
    if (want.ndim < 0 || want.ndim > TG_MAX_DIMS) { ir_fail(g, s, "tg_reshape: rank %d is out of range", want.ndim); return false; }
    for (int i = 0; i < want.ndim; i++) {
        if (want.d[i] == -1) {
            if (infer >= 0) { ir_fail(g, s, "tg_reshape: %s -> %s: more than one -1", shape_str(x, sx), shape_str(want, sw)); return false; }
            infer = i;
        } else if (want.d[i] <= 0) {
            ir_fail(g, s, "tg_reshape: %s -> %s: dimensions must be positive or -1", shape_str(x, sx), shape_str(want, sw));
            return false;
        } else if (__builtin_mul_overflow(known, want.d[i], &known)) {
            ir_fail(g, s, "tg_reshape: %s -> %s: the new shape's element count overflows", shape_str(x, sx), shape_str(want, sw));
            return false;
        }
    }
    int64_t n = shape_numel(x);
    if (infer >= 0) {
        if (n % known) { ir_fail(g, s, "tg_reshape: %s -> %s: %lld elements do not divide", shape_str(x, sx), shape_str(want, sw), (long long)n); return false; }
        want.d[infer] = n / known;
        known = n;
    }
    if (known != n) {
        ir_fail(g, s, "tg_reshape: %s -> %s: element counts differ (%lld vs %lld)", shape_str(x, sx),
                shape_str(want, sw), (long long)n, (long long)known);
        return false;
    }
    *out = want;
    return true;
}

bool shape_permute(tg_graph *g, tg_site s, tg_shape x, tg_shape order, tg_shape *out) {
    char sx[96], so[96];
    bool seen[TG_MAX_DIMS] = { false };
    if (order.ndim != x.ndim) {
        ir_fail(g, s, "tg_permute: order %s has %d axes but the tensor %s has %d", shape_str(order, so), order.ndim, shape_str(x, sx), x.ndim);
        return false;
    }
    tg_shape r = x;
    for (int i = 0; i < x.ndim; i++) {
        int64_t a = order.d[i] < 0 ? order.d[i] + x.ndim : order.d[i];
        if (a < 0 || a >= x.ndim || seen[a]) {
            ir_fail(g, s, "tg_permute: %s is not a permutation of the axes of %s", shape_str(order, so), shape_str(x, sx));
            return false;
        }
        seen[a] = true;
        r.d[i] = x.d[a];
    }
    *out = r;
    return true;
}
