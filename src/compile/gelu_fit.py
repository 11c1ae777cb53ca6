"""Where expr.c's tgk_mills coefficients come from: Mills ratio R(t) = (1 - Phi(t)) / phi(t) of the
standard normal, written R(t) = tau Q(tau) with tau = 1 / (1 + C t), Q of degree DEG interpolated at
Chebyshev nodes over t in [0, TMAX] (past 14, phi is below f32's smallest normal), then turned into
powers of tau for Horner's rule. Prints the coefficients (lowest power first) and the worst error of
GELU's derivative evaluated as expr.c does, in double and rounded to f32 at every step (the error
relative to max(|value|, 1e-3)), beside erff's form.   python3 src/compile/gelu_fit.py"""
import math, struct

C, DEG, TMAX = 0.3, 10, 14.0
SQRT_2PI = math.sqrt(2 * math.pi)


def f32(x):
    return struct.unpack('f', struct.pack('f', x))[0]


def mills(t):
    return 0.5 * math.erfc(t / math.sqrt(2)) * SQRT_2PI * math.exp(t * t / 2)


def fit():
    a, b, n = 1 / (1 + C * TMAX), 1.0, DEG + 1
    nodes = [(a + b) / 2 + (b - a) / 2 * math.cos(math.pi * (k + 0.5) / n) for k in range(n)]
    vals = [mills((1 / tau - 1) / C) / tau for tau in nodes]
    cheb = [2 / n * sum(v * math.cos(math.pi * j * (k + 0.5) / n) for k, v in enumerate(vals)) for j in range(n)]
    cheb[0] /= 2
    T = [[1.0], [0.0, 1.0]]   # Chebyshev polynomials in u, then u = alpha tau + beta
    for j in range(2, n):
        p, q = [0.0] + [2 * x for x in T[j - 1]], T[j - 2]
        T.append([p[i] - (q[i] if i < len(q) else 0.0) for i in range(len(p))])
    in_u = [sum(cheb[j] * T[j][i] for j in range(n) if i < len(T[j])) for i in range(n)]
    alpha, beta = 2 / (b - a), -(a + b) / (b - a)
    return [sum(in_u[i] * math.comb(i, k) * alpha ** k * beta ** (i - k) for i in range(k, n)) for k in range(n)]


def gelu_grad(x, q, r):   # as expr.c's tgk_gelu_grad, every step rounded by r
    t = r(abs(x))
    tau = r(1 / r(1 + r(C * t)))
    acc = r(q[-1])
    for co in reversed(q[:-1]):
        acc = r(acc * tau + r(co))
    e = r(r(1 / SQRT_2PI) * r(2 ** r(r(-0.5 / math.log(2) * x) * x)))
    d = r(e * r(r(tau * acc) - t))
    return r(1 - d) if x > 0 else d


def erf_form(x):
    e = f32(math.erf(f32(x * f32(0.70710678118654752))))
    return f32(f32(0.5 * f32(1 + e)) + f32(f32(x * f32(0.39894228040143268)) * f32(math.exp(f32(f32(-0.5 * x) * x)))))


q = fit()
print(', '.join('%.9ef' % v for v in q))
exact = lambda x: 0.5 * math.erfc(-x / math.sqrt(2)) + x * math.exp(-x * x / 2) / SQRT_2PI
xs = [f32(i / 2000) for i in range(-40000, 40001)]
for name, fn in (('double', lambda x: gelu_grad(x, q, float)), ('f32', lambda x: gelu_grad(x, q, f32)), ('erff form, f32', erf_form)):
    print('%-15s worst error %.2e' % (name, max(abs(fn(x) - exact(x)) / max(abs(exact(x)), 1e-3) for x in xs)))
