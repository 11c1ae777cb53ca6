/* Optimizers inside the graph: gradient clipping and the Adam/AdamW/SGD updates are appended as
 * ordinary nodes; new parameter and state values go back through write-backs (tg_assign). The
 * per-step scalars (learning rate, bias corrections) are HYPER nodes the host fills each step,
 * computed in double as PyTorch does in Python, so a schedule never needs a recompile. */
#include "graph/graph.h"

#include <math.h>
#include <stdlib.h>

enum { H_LR = HYPER_SEED + 1, H_STEP_SIZE, H_BC2_SQRT, H_DECAY_FACTOR, N_HYPER };

/* ----- schedules ----- */

static tg_schedule sched(tg_lr_kind k, double peak) {
    tg_schedule s = { 0 };
    s.kind = k;
    s.peak = peak;
    s.final = peak;
    s.gamma = 1;
    return s;
}

tg_schedule tg_lr_constant(double lr) { return sched(TG_LR_CONSTANT, lr); }

tg_schedule tg_lr_linear(double peak, double final, int64_t steps) {
    tg_schedule s = sched(TG_LR_LINEAR, peak);
    s.final = final;
    s.steps = steps;
    return s;
}

tg_schedule tg_lr_cosine(double peak, double final, int64_t steps) {
    tg_schedule s = tg_lr_linear(peak, final, steps);
    s.kind = TG_LR_COSINE;
    return s;
}

tg_schedule tg_lr_warmup(double peak, int64_t steps, const tg_schedule *after) {
    tg_schedule s = sched(TG_LR_WARMUP, peak);
    s.steps = steps;
    s.after = after;
    return s;
}

tg_schedule tg_lr_staircase(double peak, int64_t every, double gamma) {
    tg_schedule s = sched(TG_LR_STAIRCASE, peak);
    s.every = every;
    s.gamma = gamma;
    return s;
}

tg_schedule tg_lr_multistep(double peak, const int64_t *milestones, int n, double gamma) {
    tg_schedule s = sched(TG_LR_MULTISTEP, peak);
    s.gamma = gamma;
    for (int i = 0; milestones && i < n && i < TG_MAX_MILESTONES; i++) s.milestones[s.n_milestones++] = milestones[i];
    return s;
}

/* Warmups hand over to their `after` schedule; a chain longer than this (a cycle, say) ends in
 * its last warmup's peak. The runtime copies chains of the same length. */
#define MAX_CHAIN 8

double tg_schedule_at(const tg_schedule *s, int64_t t) {
    for (int depth = 0; s && s->kind == TG_LR_WARMUP; depth++) {
        if (s->steps > 0 && t <= s->steps) return s->peak * (double)t / (double)s->steps;
        if (!s->after || depth + 1 == MAX_CHAIN) return s->peak;
        t -= s->steps > 0 ? s->steps : 0;
        s = s->after;
    }
    if (!s) return 0;
    int64_t c = t - 1;   /* steps completed before this one */
    double frac = s->steps > 0 ? (double)(c < s->steps ? c : s->steps) / (double)s->steps : 1;
    switch (s->kind) {
    case TG_LR_CONSTANT: return s->peak;
    case TG_LR_LINEAR: return s->peak + (s->final - s->peak) * frac;
    case TG_LR_COSINE: return s->final + (s->peak - s->final) * (1 + cos(M_PI * frac)) / 2;
    case TG_LR_WARMUP: break;   /* handled above */
    case TG_LR_STAIRCASE: return s->peak * pow(s->gamma, (double)(s->every > 0 ? c / s->every : 0));
    case TG_LR_MULTISTEP: {
        int k = 0;
        for (int i = 0; i < s->n_milestones; i++) k += s->milestones[i] <= c;
        return s->peak * pow(s->gamma, k);
    }
    }
    return s->peak;
}

/* ----- optimizers ----- */

static tg_optimizer base(tg_opt_kind k, double lr) {
    tg_optimizer o = { 0 };
    o.kind = k;
    o.lr = tg_lr_constant(lr);
    o.b1 = 0.9;
    o.b2 = 0.999;
    o.eps = 1e-8;
    return o;
}

tg_optimizer tg_adam(double lr) { return base(TG_OPT_ADAM, lr); }

tg_optimizer tg_adamw(double lr, double weight_decay) {
    tg_optimizer o = base(TG_OPT_ADAMW, lr);
    o.weight_decay = weight_decay;
    return o;
}

tg_optimizer tg_sgd(double lr, double momentum, int nesterov, double weight_decay) {
    tg_optimizer o = base(TG_OPT_SGD, lr);
    o.momentum = momentum;
    o.nesterov = nesterov;
    o.weight_decay = weight_decay;
    return o;
}

void optim_hyper(const tg_optimizer *opt, int64_t t, double lr, double *hyper) {
    hyper[H_LR] = lr;   /* hyper[HYPER_SEED] is the caller's */
    hyper[H_STEP_SIZE] = lr / (1 - pow(opt->b1, (double)t));
    hyper[H_BC2_SQRT] = sqrt(1 - pow(opt->b2, (double)t));
    hyper[H_DECAY_FACTOR] = 1 - lr * opt->weight_decay;
}

/* Global L2-norm clipping (torch.nn.utils.clip_grad_norm_): one scale for every gradient. */
static void clip(tg_graph *g, tg_site s, int *grads, int n, double max_norm) {
    tg_tensor total = op_const(g, s, 0, TG_FLOAT32);
    for (int i = 0; i < n; i++)
        total = op_binary(s, OP_ADD, total, tg_sum_at(s, op_unary(s, OP_SQUARE, mk_tensor(g, grads[i])), TG_ALL, 0));
    tg_tensor norm = op_unary(s, OP_SQRT, total);
    tg_tensor coef = op_binary(s, OP_DIV, op_const(g, s, max_norm, TG_FLOAT32),
                               op_binary(s, OP_ADD, norm, op_const(g, s, 1e-6, TG_FLOAT32)));
    coef = op_binary(s, OP_MIN, coef, op_const(g, s, 1, TG_FLOAT32));
    for (int i = 0; i < n; i++) grads[i] = op_binary(s, OP_MUL, mk_tensor(g, grads[i]), coef).id;
}

#define C(v) op_const(g, s, (v), TG_FLOAT32)
#define ADD(a, b) op_binary(s, OP_ADD, a, b)
#define SUB(a, b) op_binary(s, OP_SUB, a, b)
#define MUL(a, b) op_binary(s, OP_MUL, a, b)
#define DIV(a, b) op_binary(s, OP_DIV, a, b)

/* torch.optim.Adam / AdamW, single-tensor path: m.lerp_(g, 1 - b1); v = b2 v + (1 - b2) g^2;
 * p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). */
static void adam_update(tg_graph *g, const tg_optimizer *o, int pnode, tg_tensor grad, bool decoupled, bool decays) {
    tg_site s = g->nodes[pnode].site;
    tg_tensor p = mk_tensor(g, pnode);
    if (!decoupled && decays && o->weight_decay != 0) grad = ADD(grad, MUL(p, C(o->weight_decay)));
    if (decoupled && decays && o->weight_decay != 0) p = MUL(p, op_hyper(g, H_DECAY_FACTOR));
    tg_tensor m = op_state(g, pnode), v = op_state(g, pnode);
    tg_tensor m1 = ADD(m, MUL(SUB(grad, m), C(1 - o->b1)));
    tg_tensor v1 = ADD(MUL(v, C(o->b2)), MUL(op_unary(s, OP_SQUARE, grad), C(1 - o->b2)));
    tg_tensor denom = ADD(DIV(op_unary(s, OP_SQRT, v1), op_hyper(g, H_BC2_SQRT)), C(o->eps));
    tg_tensor p1 = SUB(p, MUL(DIV(m1, denom), op_hyper(g, H_STEP_SIZE)));
    ir_add_assign(g, m.id, m1.id);
    ir_add_assign(g, v.id, v1.id);
    ir_add_assign(g, pnode, p1.id);
}

/* torch.optim.SGD with dampening 0: L2 decay, momentum buffer (equal to the gradient on step 1,
 * which a zero buffer gives exactly), Nesterov. */
static void sgd_update(tg_graph *g, const tg_optimizer *o, int pnode, tg_tensor grad, bool decays) {
    tg_site s = g->nodes[pnode].site;
    tg_tensor p = mk_tensor(g, pnode);
    if (decays && o->weight_decay != 0) grad = ADD(grad, MUL(p, C(o->weight_decay)));
    if (o->momentum != 0) {
        tg_tensor buf = op_state(g, pnode);
        tg_tensor buf1 = ADD(MUL(buf, C(o->momentum)), grad);
        ir_add_assign(g, buf.id, buf1.id);
        grad = o->nesterov ? ADD(grad, MUL(buf1, C(o->momentum))) : buf1;
    }
    ir_add_assign(g, pnode, SUB(p, MUL(grad, op_hyper(g, H_LR))).id);
}

/* The step's guard: loss + sum over parameters of sum(grad * 0). Inf * 0 and NaN * 0 are NaN,
 * so this one scalar is finite exactly when the loss and every gradient element are; backends
 * check it before replacing any parameter or optimizer state. Built before the updates, so its
 * kernel runs before theirs. */
static void guard_build(tg_graph *g, const int *grads, int n) {
    tg_site s = TG_HERE;
    tg_tensor guard = mk_tensor(g, g->output);
    for (int i = 0; i < n && ir_ok(g); i++)
        guard = ADD(guard, tg_sum_at(s, MUL(mk_tensor(g, grads[i]), C(0)), TG_ALL, 0));
    g->guard = guard.id;
}

/* An optimizer that cannot train (a value out of its range, NaN anywhere) fails the compile
 * rather than turning every parameter into NaN at the first step. */
static bool optim_check(tg_graph *g, const tg_optimizer *o) {
    tg_site s = { "(optimizer)", 0 };
    if (o->kind != TG_OPT_ADAM && o->kind != TG_OPT_ADAMW && o->kind != TG_OPT_SGD)
        ir_fail(g, s, "optimizer: unknown kind %d", (int)o->kind);
    else if (!(o->b1 >= 0 && o->b1 < 1) || !(o->b2 >= 0 && o->b2 < 1))
        ir_fail(g, s, "optimizer: b1 = %g and b2 = %g must be in [0, 1)", o->b1, o->b2);
    else if (!(o->eps >= 0 && isfinite(o->eps)))
        ir_fail(g, s, "optimizer: eps = %g must be finite and >= 0", o->eps);
    else if (!isfinite(o->weight_decay) || !(o->momentum >= 0 && isfinite(o->momentum)) || isnan(o->clip_norm) ||
             isinf(o->clip_norm))
        ir_fail(g, s, "optimizer: weight_decay %g, momentum %g (>= 0) and clip_norm %g must be finite", o->weight_decay,
                o->momentum, o->clip_norm);
    int depth = 0;
    for (const tg_schedule *l = &o->lr; l && depth < MAX_CHAIN && ir_ok(g); l = l->after, depth++) {
        if (l->kind < TG_LR_CONSTANT || l->kind > TG_LR_MULTISTEP)
            ir_fail(g, s, "learning-rate schedule: unknown kind %d", (int)l->kind);
        else if (!isfinite(l->peak) || !isfinite(l->final) || !isfinite(l->gamma))
            ir_fail(g, s, "learning-rate schedule: peak %g, final %g and gamma %g must be finite", l->peak, l->final,
                    l->gamma);
    }
    return ir_ok(g);
}

bool optim_build(tg_graph *g, const tg_optimizer *opt, bool guard) {
    if (!optim_check(g, opt)) return false;
    int n = 0;
    int *params = tg_alloc(sizeof(int) * 3 * (size_t)(g->n_params + 1));
    if (!params) {
        ir_fail(g, (tg_site){ "(optimizer)", 0 }, "out of memory building the optimizer");
        return false;
    }
    int *grads = params + g->n_params + 1, *ids = grads + g->n_params + 1;
    tg_graph *outer = tg__trace();   /* the public ops used below append to the traced graph */
    tg__set_trace(g);
    for (int i = 0; i < g->n_params; i++) {
        if (g->param_node[i] < 0) continue;
        ids[n] = i;
        params[n] = g->param_node[i];
        grads[n++] = g->grad_of_param[i];
    }
    g->n_hyper = N_HYPER;
    if (guard) guard_build(g, grads, n);
    else g->guard = g->output;   /* the backend checks the values it writes back itself */
    if (opt->clip_norm > 0 && n > 0) clip(g, TG_HERE, grads, n, opt->clip_norm);
    for (int i = 0; i < n && ir_ok(g); i++) {
        tg_tensor grad = mk_tensor(g, grads[i]);
        const tg_param_spec *ps = model_param(g->model, ids[i]);
        int filtered = opt->decay_filter ? opt->decay_filter(ps->name, opt->decay_ctx) : -1;
        bool decays = filtered < 0 ? ps->decay : filtered != 0;
        if (opt->kind == TG_OPT_SGD) sgd_update(g, opt, params[i], grad, decays);
        else adam_update(g, opt, params[i], grad, opt->kind == TG_OPT_ADAMW, decays);
    }
    tg__set_trace(outer);
    free(params);
    return ir_ok(g);
}
