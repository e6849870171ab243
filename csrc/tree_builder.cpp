// DySpec tree builders in C++: the greedy builder (Algorithm 1) and the threshold builder's layer-by-layer selection
// (Algorithm 2) of nbs/api/2-reference/02_builders.ipynb, drawing the same tokens as the Python reference for the same uniforms; and
// EAGLE-2's beam-and-rerank tree (the eagle2 builder), choosing the same nodes as its Python reference.
//
// The Python reference is the specification; this file repeats its arithmetic exactly:
//  * a node's draft row q (float32[V]) is read as float64 weights w; drawn tokens get weight 0; when every weight is 0
//    the undrawn tokens get weight 1 (Sequoia's fallback);
//  * a draw with uniform u is a two-level inverse CDF: blocks of BLOCK tokens, sums accumulated in token order inside
//    a block, block sums accumulated in block order, x = u * total, first block whose running sum exceeds x, then the
//    first token in it whose running sum exceeds x - (sum of the blocks before). torch.cumsum on the CPU accumulates
//    in the same order, so both give the same token and the same r = w[y] / total, bit for bit;
//  * a negative uniform asks for a top draw (draws='top'): the most probable undrawn token, the first of equals, with the
//    same r = w[y] / total;
//  * the heap pops the largest value first and, among equal values, the slot pushed first (Python's heapq on
//    (-value, counter)).
// What C++ saves: only the block of a drawn token is summed again (BLOCK additions instead of V), top draws read block
// maxima kept the same way, and the loop, heap and bookkeeping run without the interpreter. No libtorch: rows arrive as
// float32 numpy arrays through a Python callback.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <queue>
#include <string>
#include <vector>

namespace py = pybind11;
using i64 = std::int64_t;

constexpr i64 BLOCK = 256;   // must equal dyspec_nb.tree.CDF_BLOCK

// The residual draft distribution of one node while its children are drawn without replacement.
struct Residual {
    py::array_t<float> owner;        // keeps the row's memory alive
    const float* q = nullptr;        // float32[V]: the node's draft row
    i64 V = 0, nb = 0;
    std::vector<double> bsum;        // float64[nb]: sum of the residual weights of each block, in token order
    double tot = 0.0;                // the block sums added in block order
    std::vector<double> bsq;         // float64[nb]: sum of the squared residual weights of each block (the cost rule's r-bar)
    double sq = 0.0;
    std::vector<i64> drawn;          // drawn tokens, sorted
    bool uniform = false;            // support used up: weight 1 on every undrawn token
    mutable std::vector<double> bmax;    // per block: its largest residual weight and that token (the first of equals);
    mutable std::vector<i64> barg;       // for top draws, filled on the first one and kept by remove

    // Visit the tokens j of block k in order with their residual weight w; stop when f(j, w) returns true.
    template <class F> void scan_block(i64 k, F f) const {
        i64 lo = k * BLOCK, hi = std::min(V, lo + BLOCK);
        auto d = std::lower_bound(drawn.begin(), drawn.end(), lo);
        for (i64 j = lo; j < hi; ++j) {
            double w;
            if (d != drawn.end() && *d == j) { w = 0.0; ++d; }
            else w = uniform ? 1.0 : (double)q[j];
            if (f(j, w)) return;
        }
    }
    void sum_block(i64 k) {          // bsum[k] (and bsq[k]) from scratch, in token order
        double acc = 0.0, acc2 = 0.0;
        scan_block(k, [&](i64, double w) { acc += w; acc2 += w * w; return false; });
        bsum[k] = acc; bsq[k] = acc2;
    }
    void sum_total() { tot = 0.0; sq = 0.0; for (double b : bsum) tot += b; for (double b : bsq) sq += b; }
    // Expected probability of the next drawn token under the residual: sum of squared residual probabilities.
    double collision() const { return sq / (tot * tot); }
    void max_block(i64 k) const {    // bmax[k], barg[k] from scratch
        double m = -1.0; i64 a = -1;
        scan_block(k, [&](i64 j, double w) { if (w > m) { m = w; a = j; } return false; });
        bmax[k] = m; barg[k] = a;
    }
    // The most probable undrawn token (the first of equals) and its weight: what a top draw takes. The first call scans
    // the row (V tokens), later ones the block maxima (V / BLOCK): `remove` keeps them.
    std::pair<i64, double> top() const {
        if (bmax.empty()) { bmax.resize(nb); barg.resize(nb); for (i64 b = 0; b < nb; ++b) max_block(b); }
        i64 y = -1; double wy = -1.0;
        for (i64 b = 0; b < nb; ++b) if (bsum[b] > 0 && bmax[b] > wy) { y = barg[b]; wy = bmax[b]; }
        return {y, wy};
    }
    // The probability r of the next child's token before it is drawn: collision() for a random draw, the top token's for a top draw.
    double expected_r(bool top_draw) const { return top_draw ? top().second / tot : collision(); }

    // Token drawn with uniform u, and its probability r under the current residual; u < 0: a top draw.
    std::pair<i64, double> draw(double u) const {
        if (u < 0) { auto [y, wy] = top(); return {y, wy / tot}; }
        double x = u * tot, run = 0.0, base = 0.0;
        i64 k = -1, last = -1;
        for (i64 b = 0; b < nb; ++b) {
            double next = run + bsum[b];
            if (bsum[b] > 0) last = b;
            if (next > x) { k = b; base = run; break; }
            run = next;
        }
        if (k < 0) {                 // x rounded up to the total: the last block with weight (base as the reference)
            k = last; base = 0.0;
            for (i64 b = 0; b < k; ++b) base += bsum[b];
        }
        double xb = x - base, acc = 0.0, wy = 0.0;
        i64 y = -1, lastj = -1;
        double lastw = 0.0;
        scan_block(k, [&](i64 j, double w) {
            acc += w;
            if (w > 0) { lastj = j; lastw = w; }
            if (acc > xb) { y = j; wy = w; return true; }
            return false;
        });
        if (y < 0) { y = lastj; wy = lastw; }
        return {y, wy / tot};
    }

    void remove(i64 y) {
        drawn.insert(std::upper_bound(drawn.begin(), drawn.end(), y), y);
        sum_block(y / BLOCK);
        if (!bmax.empty()) max_block(y / BLOCK);
        sum_total();
        if (!(tot > 0) && !uniform) {               // support used up: uniform over the undrawn tokens
            uniform = true;
            for (i64 b = 0; b < nb; ++b) sum_block(b);
            sum_total();
            bmax.clear();                           // the maxima again on the next top draw
        }
    }
    bool exhausted() const { return !(tot > 0); }
};

// Sum every block of a fresh row in token order (8 blocks at a time: independent chains, same arithmetic), and check
// that the row is a probability distribution as check_distributions does.
static std::unique_ptr<Residual> make_residual(py::array_t<float> rows, i64 r, double atol) {
    auto R = std::make_unique<Residual>();
    R->owner = rows;
    R->V = rows.shape(1);
    R->q = rows.data(r);
    R->nb = (R->V + BLOCK - 1) / BLOCK;
    R->bsum.assign(R->nb, 0.0);
    R->bsq.assign(R->nb, 0.0);
    const float* q = R->q;
    bool negative = false, nonfinite = false;
    i64 full = R->V / BLOCK;                        // complete blocks
    i64 b = 0;
    for (; b + 8 <= full; b += 8) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (i64 j = 0; j < BLOCK; ++j)
            for (int t = 0; t < 8; ++t) {
                float v = q[(b + t) * BLOCK + j];
                negative |= v < 0.0f;
                nonfinite |= !std::isfinite(v);
                acc[t] += (double)v;
                acc2[t] += (double)v * (double)v;
            }
        for (int t = 0; t < 8; ++t) { R->bsum[b + t] = acc[t]; R->bsq[b + t] = acc2[t]; }
    }
    for (; b < R->nb; ++b) {
        i64 lo = b * BLOCK, hi = std::min(R->V, lo + BLOCK);
        double acc = 0.0, acc2 = 0.0;
        for (i64 j = lo; j < hi; ++j) {
            float v = q[j];
            negative |= v < 0.0f;
            nonfinite |= !std::isfinite(v);
            acc += (double)v;
            acc2 += (double)v * (double)v;
        }
        R->bsum[b] = acc; R->bsq[b] = acc2;
    }
    if (nonfinite) throw py::value_error("draft output holds NaN or infinite values");
    if (negative) throw py::value_error("draft output has negative entries: pass probabilities (softmax of logits), not logits");
    R->sum_total();
    double s = R->tot;
    if (std::fabs(s - 1.0) > atol)
        throw py::value_error("draft output row " + std::to_string(r) + " sums to " + std::to_string(s) +
                              ", not 1: rows must be probability distributions");
    return R;
}

struct Slot { double v; i64 tick; i64 node; };
struct SlotOrder {                 // priority_queue pops the "largest": highest value, then earliest tick
    template <class S> bool operator()(const S& a, const S& b) const { return a.v < b.v || (a.v == b.v && a.tick > b.tick); }
};

struct Builder {
    py::function expand;           // expand(tokens int64[n], parents int64[n], nodes int64[k]) -> float32 array [k, V]
    i64 V = -1;
    double atol;
    std::vector<i64> tokens, parents, depths;
    std::vector<double> scores;

    Builder(i64 root, py::function f, double atol_) : expand(std::move(f)), atol(atol_) {
        tokens = {root}; parents = {-1}; depths = {0}; scores = {1.0};
    }
    i64 n() const { return (i64)tokens.size(); }
    i64 add(i64 token, i64 parent, double score) {
        tokens.push_back(token); parents.push_back(parent); depths.push_back(depths[parent] + 1); scores.push_back(score);
        return n() - 1;
    }
    // One draft call for `nodes`: their rows [k, V], the shape checked (the distributions are checked by the caller).
    py::array_t<float, py::array::c_style | py::array::forcecast> call(const std::vector<i64>& nodes) {
        py::array_t<i64> t(n(), tokens.data()), p(n(), parents.data()), u((i64)nodes.size(), nodes.data());
        auto rows = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(expand(t, p, u));
        check_shape(rows, (i64)nodes.size());
        return rows;
    }
    std::vector<std::unique_ptr<Residual>> rows_for(const std::vector<i64>& nodes) {
        auto rows = call(nodes);
        std::vector<std::unique_ptr<Residual>> res;
        for (i64 r = 0; r < (i64)nodes.size(); ++r) res.push_back(make_residual(rows, r, atol));
        return res;
    }
    // The draft's answer to a call for k nodes must be [k, V], with the V of its first answer (which must hold the root).
    void check_shape(const py::array_t<float, py::array::c_style | py::array::forcecast>& rows, i64 k) {
        if (!rows || rows.ndim() != 2) throw py::value_error("the draft callback must return a float32 array [k, V]");
        if (rows.shape(0) != k)
            throw py::value_error("draft output has " + std::to_string(rows.shape(0)) + " rows, expected " + std::to_string(k));
        if (V < 0) {
            V = rows.shape(1);
            if (tokens[0] >= V) throw py::value_error("root_token " + std::to_string(tokens[0]) +
                                                      " is outside the draft's vocabulary of " + std::to_string(V));
        } else if (rows.shape(1) != V)
            throw py::value_error("draft output has vocabulary size " + std::to_string(rows.shape(1)) + ", expected " +
                                  std::to_string(V) + ": draft and target must share a vocabulary");
    }
    py::tuple result() const { return py::make_tuple(tokens, parents, scores); }
};

static const double* uniforms_of(const py::array_t<double, py::array::c_style | py::array::forcecast>& u, i64 budget) {
    if (u.ndim() != 1 || u.shape(0) < budget) throw py::value_error("need one uniform per draft token (budget)");
    return u.data();
}

// The cost rule of nbs/api/2-reference/02_builders.ipynb ("Cost-aware trees"), as the Python _Pace: draw the (n + 1)-th token in a slot
// of value v only if g C > (1 + k A) dC, g = k v r-bar (the mean r-bar of the rows fetched so far when the slot's node
// needs a draft call, which then adds `call` to dC). The calibration k also applies per token of depth: a child's slot is
// worth v r per_token, per_token = min(k, 1), so that values still fall along every path. Off when no costs are given
// (per_token 1: the uncalibrated values).
struct Pace {
    bool on = false;
    std::vector<double> t;           // t[n]: seconds of a step with n draft tokens (convex, non-decreasing)
    double c = 0.0, k = 1.0, accepted = 0.0, rbar_sum = 0.0;   // k: StepCosts.scale, the calibration of the estimate
    double per_token = 1.0;          // min(k, 1): the calibration of each token of depth in a child's slot value
    i64 calls = 0, rows = 0;
    Pace(const py::object& verify, double call, double scale, i64 budget) {
        if (verify.is_none()) return;
        on = true; c = call; k = scale; per_token = std::min(scale, 1.0);
        t = verify.cast<std::vector<double>>();
        if ((i64)t.size() < budget + 1) throw py::value_error("costs cover fewer draft tokens than the budget");
    }
    void called(double rbar) { calls += 1; rbar_sum += rbar; rows += 1; }
    void fetched(double rbar) { rbar_sum += rbar; rows += 1; }     // a further row of the same call
    void drew(double v, double r) { accepted += v * r; }
    bool pays(i64 n, double v, double rbar, bool fresh) const {
        double g = k * v * (fresh ? rbar_sum / (double)rows : rbar);
        double C = t[n] + (double)calls * c;
        double dC = t[n + 1] - t[n] + (fresh ? c : 0.0);
        return g * C > (1.0 + k * accepted) * dC;
    }
};

// DySpec's greedy tree: repeatedly draw in the open slot of highest estimated value.
py::tuple dyspec_greedy(i64 root, py::function expand, i64 budget,
                        py::array_t<double, py::array::c_style | py::array::forcecast> uniforms,
                        i64 max_depth, double atol, py::object verify, double call, double scale) {
    const double* us = uniforms_of(uniforms, budget);
    const bool top = us[0] < 0;                               // negative uniforms: top draws
    Pace pace(verify, call, scale, budget);
    Builder b(root, std::move(expand), atol);
    // A slot is ordered by its key: its value v, or for a top draw from a read row, v r of the token it would add (as
    // the Python reference: expected_r(true), the r the next top draw returns). `value` keeps v.
    struct Keyed { double v; i64 tick; i64 node; double value; };          // v: the key, as SlotOrder reads it
    std::priority_queue<Keyed, std::vector<Keyed>, SlotOrder> heap;
    std::vector<std::unique_ptr<Residual>> residual(1);      // node -> residual, created on its first expansion
    auto key = [top](double v, const Residual& R) { return top ? v * R.expected_r(true) : v; };
    i64 tick = 0, draws = 0;
    heap.push({1.0, tick++, 0, 1.0});
    while (!heap.empty() && b.n() <= budget) {
        Keyed s = heap.top(); heap.pop();
        const double v = s.value;
        if ((i64)residual.size() < b.n()) residual.resize(b.n());
        if (!residual[s.node]) {
            if (pace.on && b.n() > 1 && !pace.pays(b.n() - 1, v, 0.0, true)) break;   // the call and the draw would not pay
            residual[s.node] = std::move(b.rows_for({s.node})[0]);
            if (pace.on) pace.called(residual[s.node]->expected_r(top));
            if (top) { heap.push({key(v, *residual[s.node]), tick++, s.node, v}); continue; }   // its key was v, a bound
        }
        Residual& R = *residual[s.node];
        if (pace.on && !pace.pays(b.n() - 1, v, R.expected_r(top), false)) break;
        auto [y, r] = R.draw(us[draws++]);
        i64 child = b.add(y, s.node, v);
        if (pace.on) pace.drew(v, r);
        R.remove(y);
        if (v * (1 - r) > 0 && !R.exhausted()) heap.push({key(v * (1 - r), R), tick++, s.node, v * (1 - r)});
        const double vc = v * r * pace.per_token;            // the child's first slot (v r * 1.0 == v r without costs)
        if (vc > 0 && (max_depth < 0 || b.depths[child] < max_depth)) heap.push({vc, tick++, child, vc});
    }
    return b.result();
}

// DySpec's layer-by-layer tree: every slot whose value is at least `threshold`, one draft call per layer; with costs,
// the slots and layers that do not pay are dropped, and the result's last element says whether any was.
py::tuple dyspec_threshold(i64 root, py::function expand, i64 budget,
                           py::array_t<double, py::array::c_style | py::array::forcecast> uniforms,
                           double threshold, i64 max_depth, double atol, py::object verify, double call, double scale) {
    const double* us = uniforms_of(uniforms, budget);
    const bool top = us[0] < 0;                               // negative uniforms: top draws
    Pace pace(verify, call, scale, budget);
    bool cut = false;
    Builder b(root, std::move(expand), atol);
    std::vector<std::pair<i64, double>> layer = {{0, 1.0}};   // (node, value of its first-child slot)
    i64 tick = 0, draws = 0;
    while (!layer.empty() && b.n() <= budget) {
        std::vector<i64> nodes;
        double vmax = 0.0;
        for (auto& [u, v] : layer) { nodes.push_back(u); vmax = std::max(vmax, v); }
        if (pace.on && b.n() > 1 && !pace.pays(b.n() - 1, vmax, 0.0, true)) { cut = true; break; }   // the layer's call would not pay
        auto res = b.rows_for(nodes);                         // one batched draft call for the whole layer
        if (pace.on) for (i64 i = 0; i < (i64)res.size(); ++i) {
            if (i == 0) pace.called(res[i]->expected_r(top)); else pace.fetched(res[i]->expected_r(top));
        }
        std::priority_queue<Slot, std::vector<Slot>, SlotOrder> heap;
        for (i64 i = 0; i < (i64)layer.size(); ++i) heap.push({layer[i].second, tick++, i});   // node: index in layer
        std::vector<std::pair<i64, double>> nxt;
        while (!heap.empty() && b.n() <= budget) {
            Slot s = heap.top(); heap.pop();
            Residual& R = *res[s.node];
            i64 u = layer[s.node].first;
            if (pace.on && !pace.pays(b.n() - 1, s.v, R.expected_r(top), false)) { cut = true; continue; }   // drop this slot
            auto [y, r] = R.draw(us[draws++]);
            i64 child = b.add(y, u, s.v);
            if (pace.on) pace.drew(s.v, r);
            R.remove(y);
            if (s.v * (1 - r) >= threshold && !R.exhausted()) heap.push({s.v * (1 - r), tick++, s.node});
            const double vc = s.v * r * pace.per_token;      // the child's first slot
            if (vc >= threshold && (max_depth < 0 || b.depths[child] < max_depth)) nxt.push_back({child, vc});
        }
        layer = std::move(nxt);
    }
    return py::make_tuple(b.tokens, b.parents, b.scores, cut);
}

// ---- EAGLE-2's tree ----
// The Python reference (eagle2 in nbs/api/2-reference/02_builders.ipynb) is the specification:
//  * a row's top-k children are its k largest probabilities, ties to the smaller token id; zero probabilities never count;
//  * a candidate's score is its parent's score times (double)q[y], in float64;
//  * candidates rank by (higher score, shallower, created earlier); created in frontier order, then by child rank;
//  * the next frontier is the best `topk` candidates of the layer, added to the tree in creation order;
//  * the kept tree is the best `budget` candidates; those not yet in the tree are added in creation order.

// Check row r of `rows` as check_distributions does, then return its top-k (probability, token), best first. Two passes
// that vectorise: the check keeps 8 independent float64 sums (a NaN or infinity makes the total non-finite) and ORs the
// sign bits (an exact `< 0` scan only when one is set, since -0.0 is not negative); the selection looks at 8 entries at a
// time and enters them one by one only when their maximum beats the k-th best so far.
static std::vector<std::pair<float, i64>> checked_topk(const py::array_t<float, py::array::c_style | py::array::forcecast>& rows,
                                                       i64 r, i64 k, double atol) {
    const i64 V = rows.shape(1);
    const float* q = rows.data(r);
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::uint32_t signs = 0;
    i64 j = 0;
    for (; j + 8 <= V; j += 8)
        for (int t = 0; t < 8; ++t) {
            acc[t] += (double)q[j + t];
            std::uint32_t bits; std::memcpy(&bits, q + j + t, 4); signs |= bits;
        }
    for (; j < V; ++j) { acc[0] += (double)q[j]; std::uint32_t bits; std::memcpy(&bits, q + j, 4); signs |= bits; }
    double sum = 0.0;
    for (double a : acc) sum += a;
    if (!std::isfinite(sum)) throw py::value_error("draft output holds NaN or infinite values");
    if ((signs >> 31) && std::any_of(q, q + V, [](float v) { return v < 0.0f; }))
        throw py::value_error("draft output has negative entries: pass probabilities (softmax of logits), not logits");
    if (std::fabs(sum - 1.0) > atol)
        throw py::value_error("draft output row " + std::to_string(r) + " sums to " + std::to_string(sum) +
                              ", not 1: rows must be probability distributions");
    std::vector<std::pair<float, i64>> top;                 // best first: higher probability, then smaller token
    top.reserve(k + 1);
    float worst = 0.0f;                                     // entries must beat this to enter (0: zeros never count)
    auto offer = [&](i64 i) {
        float v = q[i];
        if (!(v > worst)) return;                           // strictly better: a tie with a kept entry loses (larger id)
        auto pos = std::upper_bound(top.begin(), top.end(), v, [](float x, const std::pair<float, i64>& e) { return x > e.first; });
        top.insert(pos, {v, i});
        if ((i64)top.size() > k) top.pop_back();
        if ((i64)top.size() == k) worst = top.back().first;
    };
    for (j = 0; j + 8 <= V; j += 8) {
        float m = q[j];
        for (int t = 1; t < 8; ++t) m = std::max(m, q[j + t]);
        if (m > worst) for (int t = 0; t < 8; ++t) offer(j + t);
    }
    for (; j < V; ++j) offer(j);
    return top;
}

struct Cand { double score; i64 depth, order, parent, token; };
static bool cand_before(const Cand& a, const Cand& b) {     // the reference's sort key (-score, depth, order)
    if (a.score != b.score) return a.score > b.score;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.order < b.order;
}

// EAGLE-2's tree: (tokens, parents, scores) of every node added, and `keep`, the sorted nodes of the tree to return.
py::tuple eagle2(i64 root, py::function expand, i64 budget, i64 topk, i64 depth, double atol) {
    if (topk < 1 || depth < 1 || budget < 1) throw py::value_error("budget, topk and depth must be positive");
    Builder b(root, std::move(expand), atol);
    std::vector<Cand> cand;
    std::vector<i64> node_of;                               // candidate order -> tree node, -1 while not in the tree
    std::vector<i64> frontier = {0};
    for (i64 d = 1; d <= depth; ++d) {
        auto rows = b.call(frontier);                       // one batched draft call per layer
        i64 first = (i64)cand.size();
        for (i64 i = 0; i < (i64)frontier.size(); ++i) {
            i64 u_ = frontier[i];
            for (auto& [pr, tok] : checked_topk(rows, i, topk, atol)) {
                double s = b.scores[u_] * (double)pr;
                if (s > 0) { cand.push_back({s, d, (i64)cand.size(), u_, tok}); node_of.push_back(-1); }
            }
        }
        if (d == depth) break;
        std::vector<Cand> layer(cand.begin() + first, cand.end());
        i64 m = std::min<i64>(topk, (i64)layer.size());
        std::partial_sort(layer.begin(), layer.begin() + m, layer.end(), cand_before);
        layer.resize(m);
        std::sort(layer.begin(), layer.end(), [](const Cand& a, const Cand& c) { return a.order < c.order; });
        frontier.clear();
        for (auto& c : layer) { node_of[c.order] = b.add(c.token, c.parent, c.score); frontier.push_back(node_of[c.order]); }
        if (frontier.empty()) break;
    }
    i64 m = std::min<i64>(budget, (i64)cand.size());
    std::vector<Cand> best(cand);
    std::partial_sort(best.begin(), best.begin() + m, best.end(), cand_before);
    best.resize(m);
    std::sort(best.begin(), best.end(), [](const Cand& a, const Cand& c) { return a.order < c.order; });
    std::vector<i64> keep = {0};
    for (auto& c : best) {
        if (node_of[c.order] < 0) node_of[c.order] = b.add(c.token, c.parent, c.score);
        keep.push_back(node_of[c.order]);
    }
    std::sort(keep.begin(), keep.end());
    return py::make_tuple(b.tokens, b.parents, b.scores, keep);
}

// One draw from a row, for tests: (token, probability) of the two-level inverse CDF after removing `drawn` in order.
py::tuple draw_from_row(py::array_t<float, py::array::c_style | py::array::forcecast> row, std::vector<i64> drawn, double u) {
    if (row.ndim() != 1) throw py::value_error("row must be 1-D");
    auto rows = row.reshape({(py::ssize_t)1, row.shape(0)});
    auto R = make_residual(py::array_t<float>(rows), 0, 1e-3);
    for (i64 y : drawn) R->remove(y);
    auto [y, r] = R->draw(u);
    return py::make_tuple(y, r);
}

PYBIND11_MODULE(_native, m) {
    m.doc() = "DySpec tree builders in C++ (see nbs/api/2-reference/11_native.ipynb)";
    m.attr("BLOCK") = BLOCK;
    m.def("dyspec_greedy", &dyspec_greedy, py::arg("root"), py::arg("expand"), py::arg("budget"), py::arg("uniforms"),
          py::arg("max_depth") = -1, py::arg("atol") = 1e-3, py::arg("verify") = py::none(), py::arg("call") = 0.0, py::arg("scale") = 1.0);
    m.def("dyspec_threshold", &dyspec_threshold, py::arg("root"), py::arg("expand"), py::arg("budget"),
          py::arg("uniforms"), py::arg("threshold"), py::arg("max_depth") = -1, py::arg("atol") = 1e-3,
          py::arg("verify") = py::none(), py::arg("call") = 0.0, py::arg("scale") = 1.0);
    m.def("eagle2", &eagle2, py::arg("root"), py::arg("expand"), py::arg("budget"), py::arg("topk"), py::arg("depth"),
          py::arg("atol") = 1e-3);
    m.def("draw_from_row", &draw_from_row, py::arg("row"), py::arg("drawn"), py::arg("u"));
}
