/* The text of an exported model (tg_export_c): one C99 file that needs nothing but libm, and an
 * optional header declaring its API. In the file, in order: a banner saying what it computes
 * and how to call it; the API's macros and prototypes (the header's text); the portable library
 * kernels it calls (portable_kernels.h, each under its TGK_USE_ macro); with external weights,
 * the safetensors reader (portable_loader.h); the CPU generator's kernels and entry point
 * (standalone, tidied); the weights, as static arrays; the entry points.
 *
 * The entry point tg_entry(A, B, H, R) is the CPU backend's: A the arena (the buffer plan's
 * offsets), B the bound buffers by node id (parameters, inputs). Exported, B is a local copy of a
 * static table of the weights with this call's inputs set, A the static arena or the caller's,
 * H and R unused (no per-call scalars: random ops are refused; kernels called by name). */
#include "export/export.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_LEN 96

/* An input as the API names it: a parameter in_<name> and a macro <PREFIX>_IN_<NAME>_SIZE. */
typedef struct { char ident[NAME_LEN + 8], macro[3 * NAME_LEN]; } input_name;

/* name with every character that cannot be in a C identifier replaced by '_', cut to fit. */
static void sanitize(const char *name, char *out, size_t len) {
    size_t n = 0;
    for (const char *p = name ? name : ""; *p && n + 1 < len; p++) out[n++] = isalnum((unsigned char)*p) ? *p : '_';
    out[n] = 0;
}

static void upper(const char *s, char *out, size_t len) {
    size_t n = 0;
    for (; s[n] && n + 1 < len; n++) out[n] = (char)toupper((unsigned char)s[n]);
    out[n] = 0;
}

/* The API names of the graph's inputs (nodes 0..n-1), unique: a name that sanitizes to an earlier
 * one's gets its index appended. */
static void input_names(const export_model *m, int n, input_name *names) {
    char P[NAME_LEN];
    upper(m->prefix, P, sizeof P);
    for (int i = 0; i < n; i++) {
        char base[NAME_LEN], up[NAME_LEN], suffix[16];
        sanitize(m->g->nodes[i].name, base, sizeof base - sizeof suffix);
        for (int attempt = 0; attempt < 2; attempt++) {
            if (attempt) {
                snprintf(suffix, sizeof suffix, "_%d", i);
                strcat(base, suffix);
            }
            snprintf(names[i].ident, sizeof names[i].ident, "in_%s", base);
            upper(base, up, sizeof up);
            snprintf(names[i].macro, sizeof names[i].macro, "%s_IN_%s_SIZE", P, up);
            bool clash = false;
            for (int j = 0; j < i; j++)
                clash |= strcmp(names[j].ident, names[i].ident) == 0 || strcmp(names[j].macro, names[i].macro) == 0;
            if (!clash) break;
        }
    }
}

static int n_inputs(const tg_graph *g) {
    int n = 0;
    while (n < g->n && g->nodes[n].op == OP_INPUT) n++;
    return n;
}

/* A name inside a C comment: printable ASCII, and no end of the comment. */
static void comment_text(strbuf *o, const char *s) {
    for (const char *p = s ? s : ""; *p; p++) sb_printf(o, "%c", *p < 32 || *p > 126 || (*p == '/' && p > s && p[-1] == '*') ? '?' : *p);
}

static const char *dtype_str(tg_dtype d) { return d == TG_INT32 ? "i32" : "f32"; }
static const char *ctype_str(tg_dtype d) { return d == TG_INT32 ? "int32_t" : "float"; }

/* "(float *arena, const float *in_x, const int32_t *in_ids, float *out)" without the arena when
 * with_arena is false. */
static void params(strbuf *o, const export_model *m, const input_name *names, bool with_arena) {
    int n = n_inputs(m->g);
    sb_printf(o, "(%s", with_arena ? "float *arena" : "");
    for (int i = 0; i < n; i++)
        sb_printf(o, "%sconst %s *%s", i || with_arena ? ", " : "", ctype_str(m->g->nodes[i].dtype), names[i].ident);
    sb_printf(o, "%sfloat *out)", n || with_arena ? ", " : "");
}

/* The macros and prototypes of the API: the header's body, and the top of the C file. */
static void api(strbuf *o, const export_model *m, const input_name *names) {
    const tg_graph *g = m->g;
    const tg_node *out = &g->nodes[g->output];
    char P[NAME_LEN], sh[96];
    const char *p = m->prefix;
    upper(p, P, sizeof P);
    sb_printf(o, "/* Scratch memory of one call, in floats (the buffer plan's arena). */\n");
    sb_printf(o, "#define %s_ARENA_FLOATS %zu\n", P, m->plan->arena);
    sb_printf(o, "/* Elements of each input and of the output (row-major). */\n");
    for (int i = 0; i < n_inputs(g); i++) {
        sb_printf(o, "#define %s %lld   /* input '", names[i].macro, (long long)g->nodes[i].numel);
        comment_text(o, g->nodes[i].name);
        sb_printf(o, "': %s %s */\n", dtype_str(g->nodes[i].dtype), shape_str(g->nodes[i].shape, sh));
    }
    sb_printf(o, "#define %s_OUT_SIZE %lld   /* output: f32 %s */\n\n", P, (long long)out->numel, shape_str(out->shape, sh));
    if (m->external) {
        sb_printf(o, "/* Reads the weights from a safetensors file (the one tg_export_c wrote, or a tg_save checkpoint\n"
                     " * of the model): call it once, before any forward and not during one. Returns %s_OK, or an\n"
                     " * error code with %s_init_error() saying what went wrong; the weights are then unspecified\n"
                     " * until a later call succeeds. */\n", P, p);
        sb_printf(o, "#define %s_OK 0\n#define %s_E_OPEN (-1)      /* the file cannot be opened */\n", P, P);
        sb_printf(o, "#define %s_E_FORMAT (-2)    /* not a safetensors file, or a damaged one */\n", P);
        sb_printf(o, "#define %s_E_MISSING (-3)   /* a tensor the model reads is not in it */\n", P);
        sb_printf(o, "#define %s_E_SHAPE (-4)     /* a tensor has another dtype or shape */\n", P);
        sb_printf(o, "#define %s_E_READ (-5)      /* the file ends inside a tensor */\n", P);
        sb_printf(o, "int %s_init(const char *path);\nconst char *%s_init_error(void);\n\n", p, p);
    }
    sb_printf(o, "/* The forward: out = f(inputs). Uses one static arena: one call at a time (not reentrant,\n"
                 " * not thread-safe). */\nvoid %s_forward", p);
    params(o, m, names, false);
    sb_printf(o, ";\n/* The same in the caller's arena of %s_ARENA_FLOATS floats: reentrant, since the weights are\n"
                 " * only read; calls with different arenas may run at once, from any threads. */\nvoid %s_forward_arena", P, p);
    params(o, m, names, true);
    sb_printf(o, ";\n");
}

/* What the file computes and how to build and call it. */
static void banner(strbuf *o, const export_model *m, const char *what) {
    const tg_graph *g = m->g;
    int64_t n_weights = 0;
    for (int i = 0; i < g->n_params; i++)
        if (g->param_node[i] >= 0) n_weights += g->nodes[g->param_node[i]].numel;
    sb_printf(o, "/* %s of a model exported by tensorgrad %s (tg_export_c): a forward of %d graph nodes with\n"
                 " * %lld weights (%s), scheduled and fused as the library's CPU backend runs it.\n",
              what, TG_VERSION_STRING, g->n, (long long)n_weights,
              m->external ? "read at init from a safetensors file" : "embedded");
    const char *threads = m->openmp ? "OpenMP pragmas: build with -fopenmp for threads, without for none" : "No threads";
    sb_printf(o, " *\n * Plain C99 that needs only libm (cc -std=c99 -O2 model.c main.c -lm). No dynamic allocation%s:\n"
                 " * the forward works in an arena sized by the buffer plan. %s.\n",
              m->external ? " (but stdio's, in init)" : "", threads);
    sb_printf(o, " * A forward has one output. Several outputs map to one: have the traced forward return them\n"
                 " * flattened and concatenated (tg_concat), and split out at their sizes.\n"
                 " * Internal names are static and start with tg, tgk, tgx or k<digits>; link two exported models\n"
                 " * as separate files rather than #include both in one. */\n");
}

/* ----- the C file ----- */

static const char *const KERNELS[] = { "matmul", "softmax", "softmax_causal", "argmax", "scatter_rows",
                                       "scatter_along", "col2im", "maxpool", "maxpool_bwd", "attention",
                                       "attention_bwd" };

/* The portable kernels the generated code calls, each enabled by its TGK_USE_ macro. */
static void library_kernels(strbuf *o, const export_model *m) {
    sb_printf(o, "/* ----- library kernels (portable) ----- */\n");
    for (size_t k = 0; k < sizeof KERNELS / sizeof KERNELS[0]; k++) {
        char call[64], up[64];
        snprintf(call, sizeof call, "tgk_%s(a, p);", KERNELS[k]);
        upper(KERNELS[k], up, sizeof up);
        if (strstr(m->kernels, call)) sb_printf(o, "#define TGK_USE_%s\n", up);
    }
    if (m->openmp) sb_printf(o, "#define TGK_OPENMP\n");
    sb_printf(o, "%s\n", export_kernels_text);
}

/* v as a C float literal that reads back as the same float: the shortest of 6 to 9 digits. */
static void float_literal(float v, char *buf, size_t len) {
    if (isnan(v)) { snprintf(buf, len, "NAN"); return; }
    if (isinf(v)) { snprintf(buf, len, "%sINFINITY", v < 0 ? "-" : ""); return; }
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, len - 3, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    for (char *c = buf; *c; c++)   /* a locale's decimal comma is not C */
        if (*c == ',') *c = '.';
    if (!strpbrk(buf, ".e")) strcat(buf, ".0");
    strcat(buf, "f");
}

/* A C string literal of s (every byte that is not plain printable ASCII as an octal escape). */
static void string_literal(strbuf *o, const char *s) {
    sb_printf(o, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\' || *p == '?') sb_printf(o, "\\%c", *p);
        else if (*p < 32 || *p > 126) sb_printf(o, "\\%03o", *p);
        else sb_printf(o, "%c", *p);
    }
    sb_printf(o, "\"");
}

/* The weights, one static array per parameter the graph reads (tgw_<param id>): initialized
 * here, or zero until <prefix>_init reads them. */
static void weights(strbuf *o, const export_model *m) {
    const tg_graph *g = m->g;
    char sh[96], lit[40];
    sb_printf(o, "/* ----- weights ----- */\n");
    for (int i = 0; i < g->n_params; i++) {
        int node = g->param_node[i];
        if (node < 0) continue;
        const tg_node *n = &g->nodes[node];
        sb_printf(o, "/* ");
        comment_text(o, n->name);
        sb_printf(o, " %s */\n", shape_str(n->shape, sh));
        if (m->external) {
            sb_printf(o, "static float tgw_%d[%lld];\n", i, (long long)n->numel);
            continue;
        }
        sb_printf(o, "static const float tgw_%d[%lld] = {", i, (long long)n->numel);
        for (int64_t k = 0; k < n->numel; k++) {
            float_literal(m->values[i][k], lit, sizeof lit);
            sb_printf(o, "%s%s", k % 8 ? " " : "\n    ", lit);
            if (k + 1 < n->numel) sb_printf(o, ",");
        }
        sb_printf(o, "\n};\n");
    }
    if (!m->external) return;
    sb_printf(o, "\n/* What <prefix>_init reads: each tensor's name, array and shape. */\nstatic tgx_tensor tgx_tensors[] = {\n");
    int n_tensors = 0;
    for (int i = 0; i < g->n_params; i++) {
        int node = g->param_node[i];
        if (node < 0) continue;
        const tg_node *n = &g->nodes[node];
        sb_printf(o, "    { ");
        string_literal(o, n->name);
        sb_printf(o, ", tgw_%d, %d, {", i, n->shape.ndim);
        for (int d = 0; d < n->shape.ndim; d++) sb_printf(o, "%s%lld", d ? ", " : " ", (long long)n->shape.d[d]);
        sb_printf(o, " }, 0, 0, 0 },\n");
        n_tensors++;
    }
    if (!n_tensors) sb_printf(o, "    { \"\", 0, 0, { 0 }, 0, 0, 0 },\n");   /* no empty array in C */
    sb_printf(o, "};\n");
    sb_printf(o, "static char tgx_message[512];\n\nint %s_init(const char *path) {\n"
                 "    return tgx_load(path, tgx_tensors, %d, tgx_message, sizeof tgx_message);\n}\n\n",
              m->prefix, n_tensors);
    sb_printf(o, "const char *%s_init_error(void) { return tgx_message; }\n", m->prefix);
}

/* The bound-buffer table (weights by node id) and the entry points around tg_entry. */
static void entry_points(strbuf *o, const export_model *m, const input_name *names) {
    const tg_graph *g = m->g;
    int n_bound = n_inputs(g);
    for (int i = 0; i < g->n_params; i++)
        if (g->param_node[i] >= n_bound) n_bound = g->param_node[i] + 1;
    if (n_bound == 0) n_bound = 1;
    char P[NAME_LEN];
    upper(m->prefix, P, sizeof P);
    sb_printf(o, "\n/* ----- entry points ----- */\n/* The buffers the kernels read by graph node id: the weights; each call adds its inputs. */\n");
    sb_printf(o, "static void *const tgx_bound[%d] = {", n_bound);
    int listed = 0;
    for (int i = 0; i < g->n_params; i++)
        if (g->param_node[i] >= 0) sb_printf(o, "%s\n    [%d] = (void *)tgw_%d", listed++ ? "," : "", g->param_node[i], i);
    sb_printf(o, "%s};\nstatic float tgx_arena[%s_ARENA_FLOATS > 0 ? %s_ARENA_FLOATS : 1];\n\nvoid %s_forward_arena", listed ? "\n" : " 0 ",
              P, P, m->prefix);
    params(o, m, names, true);
    sb_printf(o, " {\n    void *B[%d];\n    memcpy(B, tgx_bound, sizeof B);\n", n_bound);
    for (int i = 0; i < n_inputs(g); i++) sb_printf(o, "    B[%d] = (void *)%s;\n", i, names[i].ident);
    sb_printf(o, "    tg_entry(arena, B, 0, 0);\n");
    int home = plan_home(m->plan, g->output);
    const tg_op op = g->nodes[home].op;
    if (op == OP_INPUT || op == OP_PARAM)   /* the output is an input or a weight, relabelled */
        sb_printf(o, "    memmove(out, B[%d], %s_OUT_SIZE * sizeof(float));\n}\n\n", home, P);
    else
        sb_printf(o, "    memmove(out, arena + %zu, %s_OUT_SIZE * sizeof(float));\n}\n\n", m->plan->offset[home], P);
    sb_printf(o, "void %s_forward", m->prefix);
    params(o, m, names, false);
    sb_printf(o, " {\n    %s_forward_arena(tgx_arena", m->prefix);
    for (int i = 0; i < n_inputs(g); i++) sb_printf(o, ", %s", names[i].ident);
    sb_printf(o, ", out);\n}\n");
}

char *export_source(const export_model *m) {
    strbuf o = { 0 };
    input_name *names = tg_alloc(sizeof(input_name) * (size_t)(n_inputs(m->g) + 1));
    if (!names) return NULL;
    input_names(m, n_inputs(m->g), names);
    banner(&o, m, "The C source");
    sb_printf(&o, "#include <math.h>\n#include <stdint.h>\n%s#include <string.h>\n\n", m->external ? "#include <stdio.h>\n" : "");
    api(&o, m, names);
    sb_printf(&o, "\n");
    library_kernels(&o, m);
    if (m->external) sb_printf(&o, "/* ----- the weights' reader ----- */\n%s\n", export_loader_text);
    sb_printf(&o, "/* ----- generated kernels (the CPU backend's) ----- */\n%s\n", m->kernels);
    weights(&o, m);
    entry_points(&o, m, names);
    free(names);
    return sb_take(&o);
}

char *export_header(const export_model *m) {
    strbuf o = { 0 };
    input_name *names = tg_alloc(sizeof(input_name) * (size_t)(n_inputs(m->g) + 1));
    if (!names) return NULL;
    input_names(m, n_inputs(m->g), names);
    char P[NAME_LEN];
    upper(m->prefix, P, sizeof P);
    banner(&o, m, "The header");
    sb_printf(&o, "#ifndef %s_MODEL_H\n#define %s_MODEL_H\n\n#include <stdint.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n",
              P, P);
    api(&o, m, names);
    sb_printf(&o, "\n#ifdef __cplusplus\n}\n#endif\n#endif\n");
    free(names);
    return sb_take(&o);
}
