/* plot.h: a loss history written as CSV and as an SVG line plot, for the examples. Header-only,
 * no dependencies beyond libc and libm.
 *
 *   if (plot_check("run") != 0) return 1;     // before a long run: can run.csv be written?
 *   plot_history h = { 0 };
 *   plot_add(&h, step, loss, NAN);            // a training loss; NAN: no held-out value here
 *   plot_add(&h, step, loss, heldout);        // a row that also has a held-out loss
 *   plot_write(&h, "run", "my model", 1);     // run.csv and run.svg, log-scale y; 0 or -1
 *   plot_free(&h);
 *
 * run.csv is "step,loss" (or "step,loss,heldout" once any held-out value was added; rows without
 * one leave that field empty). run.svg is a self-contained line plot: axes, ticks, labels, one
 * line per series and a legend. A line joins its series' finite values (on a log axis, its
 * positive ones) and steps over the rest; held-out values are also marked with dots.
 */
#ifndef EXAMPLES_PLOT_H
#define EXAMPLES_PLOT_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int n, cap;
    int64_t *step;
    double *loss, *heldout;   /* heldout[i] is NAN where none was measured */
    int has_heldout;
} plot_history;

static inline void plot_free(plot_history *h) {
    free(h->step); free(h->loss); free(h->heldout);
    *h = (plot_history){ 0 };
}

/* Appends one row. Returns 0, or -1 when out of memory (the history is kept as it was). */
static inline int plot_add(plot_history *h, int64_t step, double loss, double heldout) {
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 256;
        int64_t *s = realloc(h->step, (size_t)cap * sizeof *s);
        if (s) h->step = s;
        double *l = realloc(h->loss, (size_t)cap * sizeof *l);
        if (l) h->loss = l;
        double *v = realloc(h->heldout, (size_t)cap * sizeof *v);
        if (v) h->heldout = v;
        if (!s || !l || !v) return -1;
        h->cap = cap;
    }
    h->step[h->n] = step;
    h->loss[h->n] = loss;
    h->heldout[h->n] = heldout;
    h->n++;
    if (isfinite(heldout)) h->has_heldout = 1;
    return 0;
}

static inline int plot_write_csv(const plot_history *h, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, h->has_heldout ? "step,loss,heldout\n" : "step,loss\n");
    for (int i = 0; i < h->n; i++) {
        fprintf(f, "%lld,%.9g", (long long)h->step[i], h->loss[i]);
        if (h->has_heldout) {
            if (isfinite(h->heldout[i])) fprintf(f, ",%.9g", h->heldout[i]);
            else fputc(',', f);
        }
        fputc('\n', f);
    }
    int bad = ferror(f);
    return fclose(f) == 0 && !bad ? 0 : -1;
}

/* "Nice" tick spacing for a range: 1, 2 or 5 times a power of ten, about n ticks. */
static inline double plot__tick_step(double lo, double hi, int n) {
    double raw = (hi - lo) / n, p = pow(10, floor(log10(raw))), r = raw / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
}

/* The plot area: x from step, y from value (log10 of it on a log axis). */
typedef struct { double x0, x1, y0, y1; int log_y; } plot__axes;
enum { PLOT__W = 720, PLOT__H = 440, PLOT__L = 70, PLOT__R = 150, PLOT__T = 40, PLOT__B = 50 };

static inline double plot__px(const plot__axes *a, double x) {
    return PLOT__L + (x - a->x0) / (a->x1 - a->x0) * (PLOT__W - PLOT__L - PLOT__R);
}
static inline double plot__py(const plot__axes *a, double y) {
    double v = a->log_y ? log10(y) : y;
    return PLOT__H - PLOT__B - (v - a->y0) / (a->y1 - a->y0) * (PLOT__H - PLOT__T - PLOT__B);
}
static inline int plot__usable(const plot__axes *a, double y) { return isfinite(y) && (!a->log_y || y > 0); }

/* One series as a path through its usable points (rows without a value are stepped over), and
 * with markers (or only one point) a dot on each point. */
static inline void plot__series(FILE *f, const plot_history *h, const double *v, const plot__axes *a,
                                const char *color, const char *style, int markers) {
    fprintf(f, "<path fill=\"none\" stroke=\"%s\" %s d=\"", color, style);
    int drawn = 0;
    for (int i = 0; i < h->n; i++) {
        if (!plot__usable(a, v[i])) continue;
        fprintf(f, "%s%.1f,%.1f", drawn++ ? " L" : "M", plot__px(a, (double)h->step[i]), plot__py(a, v[i]));
    }
    fprintf(f, "\"/>\n");
    for (int i = 0; (markers || drawn == 1) && i < h->n; i++)   /* a lone point gets a dot too */
        if (plot__usable(a, v[i]))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", plot__px(a, (double)h->step[i]),
                    plot__py(a, v[i]), color);
}

/* Escapes the few characters that would break the SVG text. */
static inline void plot__text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
}

static inline int plot_write_svg(const plot_history *h, const char *path, const char *title, int log_y) {
    /* Data ranges over every usable value of both series. */
    plot__axes a = { 0, 1, 0, 1, log_y };
    double ylo = INFINITY, yhi = -INFINITY;
    for (int i = 0; i < h->n; i++)
        for (int k = 0; k < 2; k++) {
            double v = k ? h->heldout[i] : h->loss[i];
            if (!plot__usable(&a, v)) continue;
            v = log_y ? log10(v) : v;
            if (v < ylo) ylo = v;
            if (v > yhi) yhi = v;
        }
    if (h->n > 0) { a.x0 = (double)h->step[0]; a.x1 = (double)h->step[h->n - 1]; }
    if (a.x1 <= a.x0) a.x1 = a.x0 + 1;
    double st = plot__tick_step(a.x0, a.x1, 6);   /* x ticks; the axis ends on whole ticks */
    a.x0 = floor(a.x0 / st) * st;
    a.x1 = ceil(a.x1 / st) * st;
    if (ylo > yhi) { ylo = 0; yhi = 1; }   /* nothing to draw: an empty frame */
    if (yhi - ylo < 1e-9) { ylo -= 0.5; yhi += 0.5; }
    if (log_y) { a.y0 = floor(ylo * 10) / 10; a.y1 = ceil(yhi * 10) / 10; }   /* decades in tenths */
    else {
        double sy = plot__tick_step(ylo, yhi, 5);
        a.y0 = floor(ylo / sy) * sy; a.y1 = ceil(yhi / sy) * sy;
        if (ylo >= 0 && a.y0 < 0) a.y0 = 0;
    }

    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int pw = PLOT__W - PLOT__L - PLOT__R, ph = PLOT__H - PLOT__T - PLOT__B;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", PLOT__W, PLOT__H, PLOT__W, PLOT__H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", PLOT__L + pw / 2);
    plot__text(f, title);
    fprintf(f, "</text>\n");

    /* x ticks, with light grid lines. */
    for (int i = (int)ceil(a.x0 / st); i * st <= a.x1 + 1e-9 * st; i++) {
        double x = i * st, px = plot__px(&a, x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e5e5e5\"/>\n", px, PLOT__T, px, PLOT__H - PLOT__B);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", px, PLOT__H - PLOT__B, px, PLOT__H - PLOT__B + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", px, PLOT__H - PLOT__B + 19, x);
    }
    /* y ticks: nice steps, or on a log axis m times powers of ten: m = 1 over more than two
     * decades, m in {1, 2, 5} over less, every m in 1..9 when that would still give < 2 ticks. */
    if (log_y) {
        static const int sets[3][10] = { { 1 }, { 1, 2, 5 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9 } };
        int set = a.y1 - a.y0 > 2 ? 0 : 1;
        for (;; set++) {
            int count = 0;
            for (int e = (int)floor(a.y0); e <= (int)ceil(a.y1); e++)
                for (int k = 0; k < 10 && sets[set][k]; k++) {
                    double lv = log10(sets[set][k] * pow(10, e));
                    count += lv >= a.y0 - 1e-9 && lv <= a.y1 + 1e-9;
                }
            if (count >= 2 || set == 2) break;
        }
        for (int e = (int)floor(a.y0); e <= (int)ceil(a.y1); e++)
            for (int k = 0; k < 10 && sets[set][k]; k++) {
                double v = sets[set][k] * pow(10, e), lv = log10(v);
                if (lv < a.y0 - 1e-9 || lv > a.y1 + 1e-9) continue;
                double py = plot__py(&a, v);
                fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", PLOT__L, py, PLOT__W - PLOT__R, py);
                fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"black\"/>\n", PLOT__L - 5, py, PLOT__L, py);
                fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", PLOT__L - 8, py + 4, v);
            }
    } else {
        double sy = plot__tick_step(a.y0, a.y1, 5);
        for (int i = 0; a.y0 + i * sy <= a.y1 + 1e-9 * sy; i++) {
            double y = a.y0 + i * sy, py = plot__py(&a, y);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", PLOT__L, py, PLOT__W - PLOT__R, py);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"black\"/>\n", PLOT__L - 5, py, PLOT__L, py);
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", PLOT__L - 8, py + 4, fabs(y) < 1e-12 * sy ? 0.0 : y);
        }
    }
    /* Frame, axis labels, the series, the legend. */
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\"/>\n", PLOT__L, PLOT__T, pw, ph);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", PLOT__L + pw / 2, PLOT__H - 10);
    fprintf(f, "<text x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">loss%s</text>\n",
            PLOT__T + ph / 2, PLOT__T + ph / 2, log_y ? " (log scale)" : "");
    plot__series(f, h, h->loss, &a, "#1f77b4", "stroke-width=\"1\" stroke-opacity=\"0.8\"", 0);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n",
            PLOT__W - PLOT__R + 12, PLOT__T + 10, PLOT__W - PLOT__R + 36, PLOT__T + 10);
    fprintf(f, "<text x=\"%d\" y=\"%d\">train</text>\n", PLOT__W - PLOT__R + 42, PLOT__T + 14);
    if (h->has_heldout) {
        plot__series(f, h, h->heldout, &a, "#d62728", "stroke-width=\"2\" stroke-dasharray=\"5,3\"", 1);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n",
                PLOT__W - PLOT__R + 12, PLOT__T + 30, PLOT__W - PLOT__R + 36, PLOT__T + 30);
        fprintf(f, "<text x=\"%d\" y=\"%d\">held-out</text>\n", PLOT__W - PLOT__R + 42, PLOT__T + 34);
    }
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* Whether PREFIX.csv can be written (it is created empty): check before a long run, not after.
 * Prints why not and returns -1, or returns 0. */
static inline int plot_check(const char *prefix) {
    char csv[4096];
    snprintf(csv, sizeof csv, "%s.csv", prefix);
    FILE *f = fopen(csv, "w");
    if (!f || fclose(f) != 0) { perror(csv); return -1; }
    return 0;
}

/* Writes PREFIX.csv and PREFIX.svg; prints what it wrote (or why it could not) and returns 0 or -1. */
static inline int plot_write(const plot_history *h, const char *prefix, const char *title, int log_y) {
    char csv[4096], svg[4096];
    snprintf(csv, sizeof csv, "%s.csv", prefix);
    snprintf(svg, sizeof svg, "%s.svg", prefix);
    if (plot_write_csv(h, csv) != 0) { fprintf(stderr, "plot: cannot write %s\n", csv); return -1; }
    if (plot_write_svg(h, svg, title, log_y) != 0) { fprintf(stderr, "plot: cannot write %s\n", svg); return -1; }
    printf("wrote %s and %s (%d points)\n", csv, svg, h->n);
    return 0;
}

#endif
