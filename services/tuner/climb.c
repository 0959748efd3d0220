/* offramp threshold climb: the hill climb of services/tuner/thresholds.py (``tune``),
   compiled. That file documents the algorithm and its choices; this is the same climb,
   decision for decision and float for float, for the rounds where the interpreter's
   overhead dominated (an adjustment round on MiniLM runs 30-40 climb rounds).

   State: e[s], the active ramp that answers sample s (r = the final model), and per-ramp
   exit counts. A ramp's threshold enters only through its rank among the ramp's sorted
   scores (the number of scores below it), so moving ramp i from rank a to rank b touches
   only the samples order[i][a..b): a trial costs O(b - a + r), not O(r n).

   Latency sums are formed exactly as the Python code forms them (per ramp in order,
   count * latency, skipping empty ramps, then the non-exits), so both give the same
   doubles and take the same moves. Built at run time by services/tuner/climb_native.py
   with -ffp-contract=off (no fused multiply-adds). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t offramp_climb_abi(void) { return 1; }

/* Python's round(x, 10): glibc's printf and strtod are both correctly rounded, and a tie at
   the 11th decimal cannot occur in binary, so this is the same double. */
static double round10(double x) {
  char buf[512];
  snprintf(buf, sizeof buf, "%.10f", x);
  return strtod(buf, NULL);
}

/* bisect_left: the number of entries of the ascending row below x */
static int64_t rank_of(const double *row, int64_t n, double x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (row[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

typedef struct {
  int64_t r, n;
  const double *sorted;   /* r x n, rows ascending */
  const int64_t *order;   /* r x n: sample at each place of the row's ascending order */
  const int32_t *pos;     /* r x n: place of each sample in the row's order */
  const uint8_t *wrong;   /* (r + 1) x n: the answer differs from the final model's */
  const double *lat;      /* r + 1: latency of a sample answered at ramp k (r: the model) */
} Window;

static double latency_sum(const Window *w, const int64_t *cnt) {
  double lat = 0.0;
  int64_t covered = 0;
  for (int64_t k = 0; k < w->r; k++) {
    if (cnt[k]) {
      lat += (double)cnt[k] * w->lat[k];
      covered += cnt[k];
    }
  }
  return lat + (double)(w->n - covered) * w->lat[w->r];
}

/* Move ramp i from rank a to rank b: updates the counts and the disagreements, and the
   answering ramps e when apply is set. */
static int64_t shift(const Window *w, const int64_t *ranks, int32_t *e, int64_t i, int64_t a,
                     int64_t b, int64_t *cnt, int64_t dis, int apply) {
  const int64_t *ord = w->order + i * w->n;
  const uint8_t *wrong = w->wrong;
  int64_t n = w->n;
  for (int64_t j = a; j < b; j++) {  /* now passing ramp i */
    int64_t s = ord[j];
    int32_t at = e[s];
    if (at > i) {
      cnt[at]--, cnt[i]++;
      dis += (int64_t)wrong[i * n + s] - (int64_t)wrong[(int64_t)at * n + s];
      if (apply) e[s] = (int32_t)i;
    }
  }
  for (int64_t j = b; j < a; j++) {  /* no longer passing ramp i: the next passing ramp */
    int64_t s = ord[j];
    if (e[s] != i) continue;
    int64_t k = i + 1;
    while (k < w->r && w->pos[k * n + s] >= ranks[k]) k++;
    cnt[i]--, cnt[k]++;
    dis += (int64_t)wrong[k * n + s] - (int64_t)wrong[i * n + s];
    if (apply) e[s] = (int32_t)k;
  }
  return dis;
}

static void reset(const Window *w, const int64_t *ranks, int32_t *e, int64_t *cnt,
                  int64_t *dis) {
  for (int64_t s = 0; s < w->n; s++) e[s] = (int32_t)w->r;
  for (int64_t k = w->r - 1; k >= 0; k--)  /* later ramps first: the earliest wins */
    for (int64_t j = 0; j < ranks[k]; j++) e[w->order[k * w->n + j]] = (int32_t)k;
  memset(cnt, 0, sizeof(int64_t) * (size_t)(w->r + 1));
  *dis = 0;
  for (int64_t s = 0; s < w->n; s++) {
    cnt[e[s]]++;
    *dis += w->wrong[(int64_t)e[s] * w->n + s];
  }
}

/* key of a feasible move, compared like the Python tuple (tier, a, b, -i) */
typedef struct { int tier; double a, b; int64_t negi; } Key;

static int key_greater(const Key *x, const Key *y) {
  if (x->tier != y->tier) return x->tier > y->tier;
  if (x->a != y->a) return x->a > y->a;
  if (x->b != y->b) return x->b > y->b;
  return x->negi > y->negi;
}

/* Returns 0, or -1 when scratch memory could not be had. In: th (capped start). Out: th,
   ranks, steps, start, counts (r + 1), disagreements, rounds and the moves taken (at most
   max_rounds; gain is the latency-sum decrease, loss the disagreement increase). */
int32_t offramp_climb(int64_t r, int64_t n, const double *sorted, const int64_t *order,
                      const uint8_t *wrong, const double *lat, int64_t allowed, double floor_,
                      double initial_step, double max_threshold, int64_t max_rounds,
                      double *th, int64_t *ranks, double *steps, double *start, int64_t *cnt,
                      int64_t *dis_out, int64_t *rounds_out, int64_t *n_moves,
                      int64_t *mv_round, int64_t *mv_ramp, double *mv_threshold,
                      double *mv_step, double *mv_gain, int64_t *mv_loss) {
  size_t rn = (size_t)(r * n);
  int32_t *pos = malloc(sizeof(int32_t) * (rn ? rn : 1));
  int32_t *e = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  int64_t *tcnt = malloc(sizeof(int64_t) * (size_t)(r + 1));
  double *cand = malloc(sizeof(double) * (size_t)(r ? r : 1));
  int64_t *crank = malloc(sizeof(int64_t) * (size_t)(r ? r : 1));
  char *fresh = malloc((size_t)(r ? r : 1));      /* cand[i] still valid */
  char *over = malloc((size_t)(r ? r : 1));       /* step halves this round */
  char *violated = malloc((size_t)(r ? r : 1));   /* of which: broke the constraint */
  if (!pos || !e || !tcnt || !cand || !crank || !fresh || !over || !violated) {
    free(pos), free(e), free(tcnt), free(cand), free(crank), free(fresh), free(over),
        free(violated);
    return -1;
  }
  for (int64_t k = 0; k < r; k++)
    for (int64_t j = 0; j < n; j++) pos[k * n + order[k * n + j]] = (int32_t)j;
  Window w = {r, n, sorted, order, pos, wrong, lat};

  int64_t dis;
  for (int64_t k = 0; k < r; k++) ranks[k] = rank_of(sorted + k * n, n, th[k]);
  reset(&w, ranks, e, cnt, &dis);
  if (dis > allowed) {  /* deployed thresholds already violate: climb from scratch */
    for (int64_t k = 0; k < r; k++) th[k] = 0.0, ranks[k] = 0;
    reset(&w, ranks, e, cnt, &dis);
  }
  double latv = latency_sum(&w, cnt);
  for (int64_t k = 0; k < r; k++) start[k] = th[k], steps[k] = initial_step, fresh[k] = 0;
  double eps = 1e-9 * ((latv < 0 ? -latv : latv) + 1.0);
  int64_t rounds = 0, moves = 0;

  while (rounds < max_rounds) {
    int any = 0;
    for (int64_t i = 0; i < r; i++) any |= th[i] < max_threshold;
    if (!any) break;
    rounds++;
    int64_t best = -1;
    int have_key = 0;
    Key best_key = {0, 0.0, 0.0, 0};
    double best_lat = 0.0;
    int64_t best_dis = 0;
    memset(over, 0, (size_t)r), memset(violated, 0, (size_t)r);
    for (int64_t i = 0; i < r; i++) {
      if (!(th[i] < max_threshold)) continue;
      if (!fresh[i]) {
        double c = th[i] + steps[i];
        cand[i] = round10(c < max_threshold ? c : max_threshold);
        crank[i] = rank_of(sorted + i * n, n, cand[i]);
        fresh[i] = 1;
      }
      double new_lat = latv;
      int64_t new_dis = dis;
      if (crank[i] != ranks[i]) {
        memcpy(tcnt, cnt, sizeof(int64_t) * (size_t)(r + 1));
        new_dis = shift(&w, ranks, e, i, ranks[i], crank[i], tcnt, dis, 0);
        new_lat = new_dis > allowed ? 0.0 : latency_sum(&w, tcnt);
      }
      if (new_dis > allowed) {
        over[i] = violated[i] = 1;
        continue;
      }
      double g = latv - new_lat;
      int64_t loss = new_dis - dis;
      Key key;
      if (g > eps) {
        if (loss <= 0) key = (Key){2, g, (double)-loss, -i};
        else key = (Key){1, g / (double)loss, g, -i};
      } else if (loss <= 0) {
        key = (Key){0, (double)-loss, 0.0, -i};
      } else {
        over[i] = 1;  /* costs agreement for nothing: shrink like a violation */
        continue;
      }
      if (!have_key || key_greater(&key, &best_key)) {
        best = i, best_key = key, have_key = 1, best_lat = new_lat, best_dis = new_dis;
      }
    }
    if (best < 0) {
      int all_floor = 1;
      for (int64_t i = 0; i < r; i++)
        if (th[i] < max_threshold && !(steps[i] <= floor_ + 1e-12)) all_floor = 0;
      if (all_floor) break;  /* no move stays within the constraint, even at the finest step */
    }
    int take = best >= 0;
    if (have_key && best_key.tier == 1) {
      for (int64_t i = 0; i < r; i++)
        if (violated[i] && steps[i] > floor_ + 1e-12) take = 0;  /* defer spending agreement */
    }
    for (int64_t i = 0; i < r; i++) {
      if (over[i] && steps[i] > floor_) {
        double half = steps[i] / 2.0;
        steps[i] = half > floor_ ? half : floor_;
        fresh[i] = 0;
      }
    }
    if (!take) continue;
    mv_round[moves] = rounds, mv_ramp[moves] = best, mv_threshold[moves] = cand[best];
    mv_step[moves] = steps[best], mv_gain[moves] = latv - best_lat;
    mv_loss[moves] = best_dis - dis;
    moves++;
    dis = shift(&w, ranks, e, best, ranks[best], crank[best], cnt, dis, 1);
    th[best] = cand[best], ranks[best] = crank[best];
    double twice = steps[best] * 2.0;
    steps[best] = twice < max_threshold ? twice : max_threshold;
    fresh[best] = 0;
    latv = best_lat;
  }
  *dis_out = dis, *rounds_out = rounds, *n_moves = moves;
  free(pos), free(e), free(tcnt), free(cand), free(crank), free(fresh), free(over),
      free(violated);
  return 0;
}
