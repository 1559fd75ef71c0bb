// Graph allocator (oomb-alloc.h): plans never overlap live tensors, memory is reused (peak << sum),
// element-wise chains run in place, plans are kept across re-runs, views keep their source alive,
// INPUT tensors are never overwritten and OUTPUT tensors survive the compute.
//
// How the dynamic checks would catch an allocator that reuses memory too early: RunNodeByNode
// computes the graph one node at a time (a one-node graph per node, same tensors), snapshots every
// tensor's bytes when it is produced, and before each node runs checks that all its sources still
// hold their snapshot. Checked by hand: changing the free rule in src/alloc.cpp to release an owner
// one reference early (`oi.remaining <= 1` instead of `== 0` in `release`) makes VariedGraph.*,
// RandomGraphs, ViewsKeepTheirSourceAlive and the overlap checks fail (a later node overwrote a
// source that still had a reader); disabling the "only this node still reads src[0]" in-place
// condition makes them fail too.

#include "test-common.h"
#include "oomb-alloc.h"
#include "../src/oomb-impl.h"   // oomb_cgraph internals (one-node graphs), a failing fake backend

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace {

using oombtest::fill_uniform;

struct Ctx {
    oomb_context * ctx;
    explicit Ctx(bool no_alloc) { ctx = oomb_init({0, no_alloc}); }
    ~Ctx() { oomb_free(ctx); }
};

struct Cpu {
    oomb_backend_t b;
    Cpu() { b = oomb_backend_cpu_init(2); }
    ~Cpu() { oomb_backend_free(b); }
};

struct Galloc {
    oomb_gallocr_t ga;
    explicit Galloc(oomb_backend_t b) { ga = oomb_gallocr_new(b); }
    ~Galloc() { oomb_gallocr_free(ga); }
};

oomb_tensor * owner_of(oomb_tensor * t) { return t->view_src ? t->view_src : t; }

// Bytes of t in logical order (any strides), bit patterns so NaN compares equal to itself.
std::vector<uint8_t> snap(const oomb_tensor * t) {
    const size_t ts = oomb_type_size(t->type);
    std::vector<uint8_t> out;
    out.reserve((size_t) oomb_nelements(t) * ts);
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
    for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
    for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
        const uint8_t * p = (const uint8_t *) oomb::elem_ptr(t, i0, i1, i2, i3);
        out.insert(out.end(), p, p + ts);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Static check of a plan: lifetimes computed here from the graph, independently of alloc.cpp.
// ---------------------------------------------------------------------------------------------

struct Life {
    int prod = -1;       // node index producing the owner (-1: leaf / input, exists from the start)
    int last = -1;       // last node index that reads it or a view of it; INT_MAX: must survive
};

std::map<oomb_tensor *, Life> lifetimes(oomb_cgraph * g) {
    std::map<oomb_tensor *, Life> L;
    const int n = oomb_graph_n_nodes(g);
    const int32_t keep = OOMB_TENSOR_FLAG_INPUT | OOMB_TENSOR_FLAG_OUTPUT | OOMB_TENSOR_FLAG_PARAM | OOMB_TENSOR_FLAG_LOSS;
    for (int i = 0; i < oomb_graph_n_leafs(g); i++) {
        oomb_tensor * o = owner_of(oomb_graph_leaf(g, i));
        L[o] = Life{-1, INT_MAX};
    }
    auto touch = [&](oomb_tensor * o, int k) {
        auto it = L.find(o);
        if (it == L.end()) L[o] = Life{-1, k};   // a view's source outside the graph
        else it->second.last = std::max(it->second.last, k);
    };
    for (int k = 0; k < n; k++) {
        oomb_tensor * t = oomb_graph_node(g, k);
        if (!t->view_src && !L.count(t)) L[t] = Life{k, k};
        for (int j = 0; j < OOMB_MAX_SRC; j++) if (t->src[j]) touch(owner_of(t->src[j]), k);
        if (t->view_src) touch(t->view_src, k);
    }
    for (int k = 0; k < n; k++) {
        oomb_tensor * t = oomb_graph_node(g, k);
        Life & l = L[owner_of(t)];
        if ((t->flags | owner_of(t)->flags) & keep) l.last = INT_MAX;
        if ((t->flags | owner_of(t)->flags) & OOMB_TENSOR_FLAG_INPUT) l.prod = -1;
    }
    if (n > 0) L[owner_of(oomb_graph_node(g, -1))].last = INT_MAX;
    return L;
}

// For every pair of arena tensors whose lifetimes overlap, their byte ranges must be disjoint.
// The one allowed sharing is in place: b is produced by the node that reads a for the last time,
// that node's op may run in place and a is its src[0]. Returns the number of pairs that share
// memory (legitimately), so callers can check that reuse happened at all.
int check_plan(oomb_cgraph * g, oomb_buffer_t arena) {
    auto L = lifetimes(g);
    struct Item { oomb_tensor * t; size_t b, e; Life l; };
    std::vector<Item> items;
    for (auto & kv : L) {
        oomb_tensor * t = kv.first;
        if (t->buffer != arena || !t->data) continue;
        const size_t off = (size_t) ((char *) t->data - (char *) oomb_buffer_base(arena));
        EXPECT_LE(off + oomb_nbytes(t), oomb_buffer_size(arena)) << t->name;
        EXPECT_EQ(off % 256, 0u) << t->name;
        items.push_back({t, off, off + std::max<size_t>(oomb_nbytes(t), 1), kv.second});
    }
    auto inplace_ok = [&](const Item & a, const Item & b) {   // b took a's memory in place
        if (a.l.last != b.l.prod || b.l.prod < 0) return false;
        return oomb::op_can_inplace(b.t->op) && b.t->src[0] == a.t && a.b == b.b;
    };
    int shared = 0, failures = 0;
    for (size_t i = 0; i < items.size(); i++) {
        for (size_t j = i + 1; j < items.size(); j++) {
            const Item & a = items[i];
            const Item & b = items[j];
            if (!(a.b < b.e && b.b < a.e)) continue;
            shared++;
            const bool live_overlap = !(a.l.last < b.l.prod || b.l.last < a.l.prod);
            if (live_overlap && !inplace_ok(a, b) && !inplace_ok(b, a)) {
                if (failures++ < 10) {
                    ADD_FAILURE() << "live tensors overlap: '" << a.t->name << "' [" << a.b << ", " << a.e << ") alive "
                                  << a.l.prod << ".." << a.l.last << " and '" << b.t->name << "' [" << b.b << ", " << b.e
                                  << ") alive " << b.l.prod << ".." << b.l.last;
                }
            }
        }
    }
    return shared;
}

oomb_buffer_t arena_of(oomb_cgraph * g) { return owner_of(oomb_graph_node(g, -1))->buffer; }

// ---------------------------------------------------------------------------------------------
// Dynamic check: compute node by node and verify every source still holds what it was produced as.
// ---------------------------------------------------------------------------------------------

std::map<const oomb_tensor *, std::vector<uint8_t>> run_node_by_node(oomb_backend_t be, oomb_context * ctx, oomb_cgraph * g) {
    std::map<const oomb_tensor *, std::vector<uint8_t>> snaps;
    for (int i = 0; i < oomb_graph_n_leafs(g); i++) snaps[oomb_graph_leaf(g, i)] = snap(oomb_graph_leaf(g, i));
    oomb_cgraph * one = oomb_new_graph_custom(ctx, 1);
    int failures = 0;
    const int n = oomb_graph_n_nodes(g);
    for (int k = 0; k < n; k++) {
        oomb_tensor * t = oomb_graph_node(g, k);
        for (int j = 0; j < OOMB_MAX_SRC; j++) {
            oomb_tensor * s = t->src[j];
            if (!s) continue;
            auto it = snaps.find(s);
            if (it == snaps.end()) { ADD_FAILURE() << "source '" << s->name << "' of node " << k << " was never produced"; continue; }
            if (it->second != snap(s) && failures++ < 10) {
                ADD_FAILURE() << "node " << k << " (" << oomb_op_name(t->op) << " '" << t->name << "'): source " << j << " '"
                              << s->name << "' was overwritten before it was read";
            }
        }
        one->nodes.assign(1, t);
        one->leafs.clear();
        one->visited.clear();
        one->version++;
        oomb_backend_graph_compute(be, one);
        snaps[t] = snap(t);
    }
    // what must survive the compute: OUTPUT and INPUT tensors and the last node
    for (int k = 0; k < n; k++) {
        oomb_tensor * t = oomb_graph_node(g, k);
        if ((t->flags & (OOMB_TENSOR_FLAG_OUTPUT | OOMB_TENSOR_FLAG_INPUT)) || k == n - 1) {
            EXPECT_TRUE(snaps[t] == snap(t)) << "'" << t->name << "' did not survive the compute";
        }
    }
    for (int i = 0; i < oomb_graph_n_leafs(g); i++) {
        oomb_tensor * t = oomb_graph_leaf(g, i);
        EXPECT_TRUE(snaps[t] == snap(t)) << "leaf '" << t->name << "' was overwritten";
    }
    return snaps;
}

void expect_close(const oomb_tensor * a, const oomb_tensor * b, double tol = 1e-5) {
    auto va = oombtest::to_vector(a), vb = oombtest::to_vector(b);
    ASSERT_EQ(va.size(), vb.size());
    int bad = 0;
    for (size_t i = 0; i < va.size(); i++) {
        if (!(std::fabs(va[i] - vb[i]) <= tol * (1.0 + std::fabs(vb[i])))) {
            if (bad++ < 5) ADD_FAILURE() << "'" << a->name << "'[" << i << "] = " << va[i] << ", reference " << vb[i];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A varied graph: element-wise chains with branches, a diamond (a value used much later), views,
// permutes and reshapes of intermediates, mul_mat (also with a transposed view), soft_max, and
// many in-place-eligible ops, one of them on an OUTPUT tensor and some on a tensor with a live view.
// ---------------------------------------------------------------------------------------------

struct Weights {
    Ctx c{false};
    oomb_tensor * w1;
    oomb_tensor * bias;
    std::vector<float> x;   // the input's values
    explicit Weights(uint32_t seed) {
        std::mt19937 rng(seed);
        w1 = oomb_set_name(oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 64, 64), "w1");
        bias = oomb_set_name(oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F32, 64), "bias");
        fill_uniform(w1, rng, -0.3f, 0.3f);
        fill_uniform(bias, rng, -0.5f, 0.5f);
        std::uniform_real_distribution<float> d(-1.0f, 1.0f);
        x.resize(64 * 48);
        for (float & v : x) v = d(rng);
    }
};

struct Varied {
    oomb_cgraph * g;
    oomb_tensor * x;                      // INPUT [64, 48]
    std::vector<oomb_tensor *> outputs;   // OUTPUT-flagged, plus the last node
};

Varied build_varied(oomb_context * ctx, const Weights & w) {
    Varied v;
    v.x = oomb_set_name(oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 64, 48), "x");
    oomb_set_input(v.x);
    oomb_tensor * h0 = oomb_set_name(oomb_silu(ctx, v.x), "h0");                 // in place eligible, but x is INPUT
    oomb_tensor * a = oomb_set_name(oomb_mul_mat(ctx, w.w1, h0), "a");         // [64, 48]
    a = oomb_set_name(oomb_add(ctx, a, w.bias), "a+b");                        // in place, broadcast bias
    oomb_tensor * early = oomb_set_name(oomb_scale(ctx, a, 0.5f), "early");    // read again at the very end (diamond)
    oomb_tensor * e = oomb_set_name(oomb_rms_norm(ctx, early, 1e-5f), "e0");
    oomb_tensor * vrow = nullptr, * late_perm = nullptr;
    for (int i = 0; i < 24; i++) {
        oomb_tensor * br = oomb_format_name(oomb_silu(ctx, e), "br%d", i);      // branch
        oomb_tensor * e2 = oomb_format_name(oomb_mul(ctx, e, br), "mul%d", i);   // in place on e unless e is kept
        if (i % 5 == 0) e2 = oomb_format_name(oomb_add(ctx, e2, oomb_scale(ctx, br, 0.1f)), "addbr%d", i);
        e2 = oomb_format_name(oomb_rms_norm(ctx, e2, 1e-5f), "e%d", i + 1);
        e = e2;
        if (i % 7 == 3) {
            oomb_tensor * p = oomb_permute(ctx, e, 1, 0, 2, 3);                  // [48, 64] view
            oomb_tensor * pc = oomb_format_name(oomb_cont(ctx, p), "perm%d", i);
            oomb_tensor * r = oomb_reshape_2d(ctx, pc, 64, 48);                  // view of pc
            e = oomb_format_name(oomb_add(ctx, e, r), "eperm%d", i);
        }
        if (i == 5) {
            // a reshape then a permute (views of views) of an intermediate, read at the very end
            late_perm = oomb_permute(ctx, oomb_reshape_3d(ctx, e, 64, 12, 4), 0, 2, 1, 3);  // [64, 4, 12]
        }
        if (i == 10) {
            oomb_set_output(e);   // OUTPUT, and the src[0] of in-place-eligible ops right after
            v.outputs.push_back(e);
        }
        if (i == 12) vrow = oomb_view_2d(ctx, e, 64, 8, e->nb[1], 16 * e->nb[1]);   // rows 16..23, read at the end
    }
    oomb_tensor * s = oomb_set_name(oomb_mul_mat(ctx, e, e), "scores");                  // [48, 48]
    oomb_tensor * sm = oomb_set_name(oomb_soft_max(ctx, s, 0.125f, -1), "probs");          // in place on scores
    oomb_tensor * o = oomb_set_name(oomb_mul_mat(ctx, oomb_transpose(ctx, e), sm), "o");   // [64, 48]
    o = oomb_set_name(oomb_add(ctx, o, early), "o+early");
    oomb_tensor * lp = oomb_reshape_2d(ctx, oomb_cont(ctx, late_perm), 64, 48);
    o = oomb_set_name(oomb_add(ctx, o, lp), "o+late");
    oomb_set_output(o);
    v.outputs.push_back(o);
    oomb_tensor * z = oomb_set_name(oomb_add(ctx, oomb_view_2d(ctx, o, 64, 8, o->nb[1], 0), vrow), "z");
    oomb_tensor * fin = oomb_set_name(oomb_scale(ctx, z, 2.0f), "final");
    v.outputs.push_back(fin);
    v.g = oomb_new_graph(ctx);
    oomb_build_forward_expand(v.g, fin);
    return v;
}

// The same graph with private memory for every tensor (no_alloc = false): the reference.
struct Reference {
    Ctx c{false};
    Varied v;
    Reference(oomb_backend_t be, const Weights & w) {
        v = build_varied(c.ctx, w);
        oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
        oomb_backend_graph_compute(be, v.g);
    }
};

TEST(VariedGraph, PlanHasNoLiveOverlapAndReusesMemory) {
    Cpu cpu;
    Weights w(1);
    Ctx c(true);
    Varied v = build_varied(c.ctx, w);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    const int shared = check_plan(v.g, arena_of(v.g));
    EXPECT_GT(shared, 10);   // memory is actually reused
    EXPECT_LT(oomb_gallocr_planned_size(ga.ga), oomb_gallocr_planned_sum(ga.ga) / 4);
    EXPECT_GE(oomb_gallocr_buffer_size(ga.ga), oomb_gallocr_planned_size(ga.ga));
    // the tensors with their own data were left alone
    EXPECT_EQ(w.w1->buffer, nullptr);
    EXPECT_EQ(w.bias->buffer, nullptr);
    // every graph tensor has data
    for (int k = 0; k < oomb_graph_n_nodes(v.g); k++) EXPECT_NE(oomb_graph_node(v.g, k)->data, nullptr);
}

TEST(VariedGraph, MatchesPrivateMemory) {
    Cpu cpu;
    Weights w(2);
    Reference ref(cpu.b, w);
    Ctx c(true);
    Varied v = build_varied(c.ctx, w);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
    oomb_backend_graph_compute(cpu.b, v.g);
    ASSERT_EQ(v.outputs.size(), ref.v.outputs.size());
    for (size_t i = 0; i < v.outputs.size(); i++) expect_close(v.outputs[i], ref.v.outputs[i]);
    // the INPUT was not overwritten
    std::vector<float> x(w.x.size());
    oomb_tensor_get_f32(v.x, x.data(), (int64_t) x.size());
    EXPECT_EQ(x, w.x);
}

TEST(VariedGraph, NodeByNodeSourcesIntact) {
    Cpu cpu;
    Weights w(3);
    Reference ref(cpu.b, w);
    Ctx c(true);
    Varied v = build_varied(c.ctx, w);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
    run_node_by_node(cpu.b, c.ctx, v.g);
    for (size_t i = 0; i < v.outputs.size(); i++) expect_close(v.outputs[i], ref.v.outputs[i]);
}

// Random DAGs of [32, 32] tensors: random reuse distances, views, OUTPUT flags, in-place chances.
TEST(RandomGraphs, PlansAndNodeByNodeRuns) {
    Cpu cpu;
    for (uint32_t seed = 0; seed < 24; seed++) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        Ctx host(false), c(true);
        std::vector<oomb_tensor *> pool;
        for (int i = 0; i < 3; i++) {
            oomb_tensor * l = oomb_format_name(oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 32, 32), "leaf%d", i);
            fill_uniform(l, rng);
            pool.push_back(l);
        }
        oomb_tensor * x = oomb_set_name(oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 32, 32), "x");
        oomb_set_input(x);
        pool.push_back(x);
        auto pick = [&]() -> oomb_tensor * {
            // mostly recent tensors, sometimes any (long lifetimes)
            const size_t n = pool.size();
            if (rng() % 4 == 0) return pool[rng() % n];
            return pool[n - 1 - rng() % std::min<size_t>(n, 4)];
        };
        oomb_tensor * t = nullptr;
        const int n_steps = 40 + (int) (rng() % 40);
        for (int s = 0; s < n_steps; s++) {
            oomb_tensor * a = s == 0 ? x : pick(), * b = pick();   // x is always read (first step)
            switch (rng() % 10) {
                case 0: t = oomb_silu(c.ctx, a); break;
                case 1: t = oomb_scale(c.ctx, a, 0.75f); break;
                case 2: t = oomb_scale(c.ctx, oomb_add(c.ctx, a, b), 0.5f); break;
                case 3: t = oomb_mul(c.ctx, a, oomb_soft_max(c.ctx, b, 1.0f, -1)); break;
                case 4: t = oomb_rms_norm(c.ctx, a, 1e-5f); break;
                case 5: t = oomb_cont(c.ctx, oomb_transpose(c.ctx, a)); break;
                case 6: t = oomb_scale(c.ctx, oomb_mul_mat(c.ctx, a, b), 1.0f / 32); break;
                case 7: t = oomb_scale(c.ctx, oomb_mul_mat(c.ctx, oomb_transpose(c.ctx, a), b), 1.0f / 32); break;
                case 8: {   // a row block of a (view) added to a reshaped b (view)
                    oomb_tensor * rows = oomb_view_2d(c.ctx, a, 32, 16, a->nb[1], 8 * a->nb[1]);
                    oomb_tensor * rb = oomb_reshape_2d(c.ctx, oomb_view_1d(c.ctx, b, 512, 512 * 4), 32, 16);
                    t = oomb_cont_4d(c.ctx, oomb_add(c.ctx, oomb_cont(c.ctx, rows), rb), 32, 16, 1, 1);
                    t = oomb_add(c.ctx, oomb_reshape_2d(c.ctx, oomb_cont_4d(c.ctx, oomb_repeat(c.ctx, t, a), 32, 32, 1, 1), 32, 32), b);
                    t = oomb_scale(c.ctx, t, 0.5f);
                    break;
                }
                default: t = oomb_soft_max(c.ctx, a, 0.5f, (int) (rng() % 3) - 1); break;
            }
            oomb_format_name(t, "n%d", s);
            if (rng() % 16 == 0) oomb_set_output(t);
            pool.push_back(t);
        }
        oomb_cgraph * g = oomb_new_graph(c.ctx);
        // several heads: every 7th pool tensor feeds the graph so that many values are read late
        oomb_tensor * fin = t;
        for (size_t i = 4; i + 1 < pool.size(); i += 7) fin = oomb_add(c.ctx, fin, oomb_scale(c.ctx, pool[i], 0.01f));
        oomb_build_forward_expand(g, fin);
        Galloc ga(cpu.b);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
        fill_uniform(x, rng);
        check_plan(g, arena_of(g));
        EXPECT_LT(oomb_gallocr_planned_size(ga.ga), oomb_gallocr_planned_sum(ga.ga));
        run_node_by_node(cpu.b, c.ctx, g);
        if (HasFailure()) break;
    }
}

// ---------------------------------------------------------------------------------------------
// Peak vs sum, in place
// ---------------------------------------------------------------------------------------------

TEST(Peak, LongElementwiseChainIsWellBelowTheSum) {
    Cpu cpu;
    Ctx host(false), c(true);
    std::mt19937 rng(7);
    oomb_tensor * x = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 256, 256);
    oomb_tensor * bias = oomb_new_tensor_1d(host.ctx, OOMB_TYPE_F32, 256);
    fill_uniform(x, rng);
    fill_uniform(bias, rng);
    auto chain = [&](oomb_context * ctx) {
        oomb_tensor * e = x;
        for (int i = 0; i < 200; i++) {
            switch (i % 4) {
                case 0: e = oomb_rms_norm(ctx, e, 1e-5f); break;
                case 1: e = oomb_silu(ctx, e); break;
                case 2: e = oomb_add(ctx, e, bias); break;
                default: e = oomb_mul(ctx, e, e); break;   // src[0] == src[1]: still in place
            }
        }
        return e;
    };
    oomb_tensor * e = chain(c.ctx);
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, e);
    ASSERT_EQ(oomb_graph_n_nodes(g), 200);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    const size_t one = 256 * 256 * 4;
    EXPECT_EQ(oomb_gallocr_planned_sum(ga.ga), 200 * one);
    EXPECT_LT(oomb_gallocr_planned_size(ga.ga), oomb_gallocr_planned_sum(ga.ga) / 20);
    EXPECT_LE(oomb_gallocr_planned_size(ga.ga), 2 * one);
    check_plan(g, arena_of(g));
    oomb_backend_graph_compute(cpu.b, g);
    // reference: the same chain with private memory
    Ctx r(false);
    oomb_tensor * re = chain(r.ctx);
    oomb_cgraph * rg = oomb_new_graph(r.ctx);
    oomb_build_forward_expand(rg, re);
    oomb_backend_graph_compute(cpu.b, rg);
    EXPECT_TRUE(snap(e) == snap(re));
}

TEST(Peak, ChainWithoutInplaceReusesFreedBlocks) {
    // cont is not in place: each step needs its source and its result, two blocks alternate
    Cpu cpu;
    Ctx host(false), c(true);
    std::mt19937 rng(8);
    oomb_tensor * x = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 256, 256);
    fill_uniform(x, rng);
    oomb_tensor * e = x;
    std::vector<oomb_tensor *> chain;
    for (int i = 0; i < 200; i++) chain.push_back(e = oomb_cont(c.ctx, i % 2 ? oomb_transpose(c.ctx, e) : e));
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, e);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    const size_t one = 256 * 256 * 4;
    EXPECT_EQ(oomb_gallocr_planned_size(ga.ga), 2 * one);
    EXPECT_LT(oomb_gallocr_planned_size(ga.ga), oomb_gallocr_planned_sum(ga.ga) / 20);
    for (size_t i = 1; i < chain.size(); i++) EXPECT_NE(chain[i]->data, chain[i - 1]->data);
    check_plan(g, arena_of(g));
    oomb_backend_graph_compute(cpu.b, g);
    // 200 transposes: an even number (100), the result equals x
    EXPECT_TRUE(snap(e) == snap(x));
}

TEST(Peak, AdjacentFreeBlocksMerge) {
    // a and b (S bytes each, side by side) die at c; d needs 2S and must land on their merged block
    Cpu cpu;
    Ctx host(false), c(true);
    std::mt19937 rng(13);
    oomb_tensor * x = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 64, 64);
    oomb_tensor * tmpl = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 64, 128);
    fill_uniform(x, rng);
    oomb_tensor * a = oomb_cont(c.ctx, x);
    oomb_tensor * b = oomb_cont(c.ctx, oomb_transpose(c.ctx, x));
    oomb_tensor * cc = oomb_mul_mat(c.ctx, a, b);
    oomb_tensor * d = oomb_repeat(c.ctx, cc, tmpl);
    oomb_tensor * e = oomb_scale(c.ctx, d, 0.5f);
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, e);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    const size_t S = 64 * 64 * 4;
    EXPECT_EQ(oomb_gallocr_planned_size(ga.ga), 3 * S);
    EXPECT_EQ(d->data, a->data);
    EXPECT_EQ(e->data, d->data);
    check_plan(g, arena_of(g));
    run_node_by_node(cpu.b, c.ctx, g);
}

TEST(InPlace, ElementwiseChainRunsInPlace) {
    Cpu cpu;
    Ctx host(false), c(true);
    std::mt19937 rng(9);
    oomb_tensor * x = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 128, 64);
    oomb_tensor * y = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 128, 64);
    fill_uniform(x, rng);
    fill_uniform(y, rng);
    // the first op reads only host tensors: it needs a new block; every later op runs on it in place
    std::vector<oomb_tensor *> chain;
    oomb_tensor * e = oomb_add(c.ctx, x, y);
    chain.push_back(e);
    chain.push_back(e = oomb_silu(c.ctx, e));
    chain.push_back(e = oomb_scale(c.ctx, e, 3.0f));
    chain.push_back(e = oomb_mul(c.ctx, e, y));
    chain.push_back(e = oomb_sub(c.ctx, e, x));
    chain.push_back(e = oomb_rms_norm(c.ctx, e, 1e-6f));
    chain.push_back(e = oomb_soft_max(c.ctx, e, 1.0f, 0));
    chain.push_back(e = oomb_swiglu(c.ctx, e, y));
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, e);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    const size_t one = 128 * 64 * 4;
    EXPECT_EQ(oomb_gallocr_planned_size(ga.ga), one);
    EXPECT_EQ(oomb_gallocr_planned_sum(ga.ga), chain.size() * one);
    for (oomb_tensor * t : chain) EXPECT_EQ(t->data, chain[0]->data);
    oomb_backend_graph_compute(cpu.b, g);
    // reference with private memory
    Ctx r(false);
    oomb_tensor * re = oomb_add(r.ctx, x, y);
    re = oomb_silu(r.ctx, re);
    re = oomb_scale(r.ctx, re, 3.0f);
    re = oomb_mul(r.ctx, re, y);
    re = oomb_sub(r.ctx, re, x);
    re = oomb_rms_norm(r.ctx, re, 1e-6f);
    re = oomb_soft_max(r.ctx, re, 1.0f, 0);
    re = oomb_swiglu(r.ctx, re, y);
    oomb_cgraph * rg = oomb_new_graph(r.ctx);
    oomb_build_forward_expand(rg, re);
    oomb_backend_graph_compute(cpu.b, rg);
    expect_close(e, re, 1e-6);
}

TEST(InPlace, NotTakenWhenTheSourceIsStillNeeded) {
    Cpu cpu;
    Ctx host(false), c(true);
    oomb_tensor * x = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 64, 16);
    std::mt19937 rng(10);
    fill_uniform(x, rng);
    oomb_tensor * a = oomb_scale(c.ctx, x, 2.0f);
    oomb_tensor * b = oomb_silu(c.ctx, a);                 // a read again below: not in place
    oomb_tensor * av = oomb_view_1d(c.ctx, a, 64, 0);        // a view of a read below
    oomb_tensor * c1 = oomb_scale(c.ctx, b, 0.5f);          // in place on b
    oomb_tensor * d = oomb_add(c.ctx, c1, a);                // in place on c1
    oomb_tensor * e = oomb_scale(c.ctx, a, 1.5f);            // a's view still to be read: not in place
    oomb_tensor * f = oomb_add(c.ctx, d, e);
    oomb_tensor * h = oomb_add(c.ctx, f, av);               // broadcast a's first row
    oomb_tensor * k = oomb_cast(c.ctx, h, OOMB_TYPE_F16);    // different type: never in place
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, k);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    EXPECT_NE(b->data, a->data);
    EXPECT_EQ(c1->data, b->data);
    EXPECT_EQ(d->data, c1->data);
    EXPECT_NE(e->data, a->data);
    EXPECT_EQ(av->data, a->data);
    EXPECT_NE(k->data, h->data);
    check_plan(g, arena_of(g));
    run_node_by_node(cpu.b, c.ctx, g);
}

// ---------------------------------------------------------------------------------------------
// Plans are kept
// ---------------------------------------------------------------------------------------------

TEST(KeptPlan, RerunIsIdenticalAndDoesNotReplan) {
    Cpu cpu;
    Weights w(4);
    Ctx c(true);
    Varied v = build_varied(c.ctx, w);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 1);
    const size_t buf_size = oomb_gallocr_buffer_size(ga.ga);
    void * base = oomb_buffer_base(arena_of(v.g));
    oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
    oomb_backend_graph_compute(cpu.b, v.g);
    std::vector<std::vector<uint8_t>> first;
    for (oomb_tensor * t : v.outputs) first.push_back(snap(t));
    for (int rep = 0; rep < 3; rep++) {
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
        EXPECT_TRUE(oomb_gallocr_reserve(ga.ga, v.g));
        EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 1);
        EXPECT_EQ(oomb_gallocr_buffer_size(ga.ga), buf_size);
        EXPECT_EQ(oomb_buffer_base(arena_of(v.g)), base);
        oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
        oomb_backend_graph_compute(cpu.b, v.g);
        for (size_t i = 0; i < v.outputs.size(); i++) EXPECT_TRUE(first[i] == snap(v.outputs[i])) << v.outputs[i]->name;
    }

    // changing the graph (one more node) plans again; earlier outputs are unchanged
    oomb_tensor * extra = oomb_set_name(oomb_soft_max(c.ctx, v.outputs.back(), 1.0f, -1), "extra");
    oomb_build_forward_expand(v.g, extra);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 2);
    check_plan(v.g, arena_of(v.g));
    oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
    oomb_backend_graph_compute(cpu.b, v.g);
    for (size_t i = 0; i + 1 < v.outputs.size(); i++) EXPECT_TRUE(first[i] == snap(v.outputs[i])) << v.outputs[i]->name;
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 2);

    // another graph object with the same nodes plans again (without growing: same size)
    const size_t size2 = oomb_gallocr_buffer_size(ga.ga);
    oomb_cgraph * g2 = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g2, extra);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g2));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 3);
    EXPECT_EQ(oomb_gallocr_buffer_size(ga.ga), size2);

    // a smaller graph: planned again, the arena is not reallocated
    Ctx c3(true);
    oomb_tensor * sx = oomb_new_tensor_1d(c3.ctx, OOMB_TYPE_F32, 16);
    oomb_set_input(sx);
    oomb_tensor * sy = oomb_silu(c3.ctx, sx);
    oomb_cgraph * g3 = oomb_new_graph(c3.ctx);
    oomb_build_forward_expand(g3, sy);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g3));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 4);
    EXPECT_EQ(oomb_gallocr_buffer_size(ga.ga), size2);
    EXPECT_EQ(oomb_gallocr_planned_size(ga.ga), 512u);
    // a bigger one grows the arena
    Ctx c4(true);
    oomb_tensor * bx = oomb_new_tensor_1d(c4.ctx, OOMB_TYPE_F32, (int64_t) size2);
    oomb_set_input(bx);
    oomb_cgraph * g4 = oomb_new_graph(c4.ctx);
    oomb_build_forward_expand(g4, oomb_silu(c4.ctx, bx));
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g4));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 5);
    EXPECT_GE(oomb_gallocr_buffer_size(ga.ga), 8 * size2);
    // the first graph again: planned again (not the stored plan), computes the same values
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, v.g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 6);
    oomb_tensor_set_f32(v.x, w.x.data(), (int64_t) w.x.size());
    oomb_backend_graph_compute(cpu.b, v.g);
    for (size_t i = 0; i + 1 < v.outputs.size(); i++) EXPECT_TRUE(first[i] == snap(v.outputs[i])) << v.outputs[i]->name;
}

// ---------------------------------------------------------------------------------------------
// Views, inputs, outputs
// ---------------------------------------------------------------------------------------------

TEST(Views, ViewsKeepTheirSourceAlive) {
    Cpu cpu;
    Ctx host(false), c(true), r(false);
    std::mt19937 rng(11);
    oomb_tensor * x = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 64, 64);
    fill_uniform(x, rng);
    auto build = [&](oomb_context * ctx, oomb_tensor ** src_out, oomb_tensor ** views_out) {
        oomb_tensor * t = oomb_set_name(oomb_scale(ctx, x, 3.0f), "t");
        // views of t only: a row, a reshape -> view -> permute chain
        oomb_tensor * row = oomb_view_1d(ctx, t, 64, 10 * t->nb[1]);
        oomb_tensor * chain = oomb_permute(ctx, oomb_view_3d(ctx, oomb_reshape_3d(ctx, t, 64, 16, 4), 64, 8, 4, t->nb[1],
                                                             16 * t->nb[1], 4 * t->nb[1]), 0, 2, 1, 3);   // [64, 4, 8]
        // a lot of churn that does not read t: cont and mul_mat are not in place, so fresh blocks are
        // taken and freed repeatedly; if t's block were freed they would land on it
        oomb_tensor * e = oomb_cont(ctx, oomb_transpose(ctx, x));
        for (int i = 0; i < 30; i++) {
            e = oomb_cont(ctx, oomb_transpose(ctx, e));
            e = oomb_scale(ctx, oomb_mul_mat(ctx, e, x), 1.0f / 64);
            e = oomb_format_name(oomb_rms_norm(ctx, e, 1e-5f), "churn%d", i);
        }
        oomb_tensor * late = oomb_reshape_2d(ctx, oomb_cont(ctx, chain), 64, 32);
        oomb_tensor * out = oomb_add(ctx, oomb_view_2d(ctx, e, 64, 32, e->nb[1], 0), late);
        out = oomb_add(ctx, out, row);
        *src_out = t;
        *views_out = row;
        return out;
    };
    oomb_tensor * t, * row, * rt, * rrow;
    oomb_tensor * out = build(c.ctx, &t, &row);
    oomb_tensor * ref = build(r.ctx, &rt, &rrow);
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, out);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    EXPECT_EQ(row->data, (char *) t->data + 10 * t->nb[1]);
    // no tensor produced while t's views are pending may share t's block
    const char * tb = (const char *) t->data, * te = tb + oomb_nbytes(t);
    bool after_t = false;
    for (int k = 0; k < oomb_graph_n_nodes(g); k++) {
        oomb_tensor * n = oomb_graph_node(g, k);
        if (n == out) break;
        if (after_t && !n->view_src) {
            const char * nb = (const char *) n->data, * ne = nb + oomb_nbytes(n);
            EXPECT_FALSE(nb < te && tb < ne) << "'" << n->name << "' was placed over t while t's views were still to be read";
        }
        if (n == t) after_t = true;
    }
    check_plan(g, arena_of(g));
    run_node_by_node(cpu.b, c.ctx, g);
    oomb_cgraph * rg = oomb_new_graph(r.ctx);
    oomb_build_forward_expand(rg, ref);
    oomb_backend_graph_compute(cpu.b, rg);
    expect_close(out, ref);
}

TEST(InputsOutputs, InputsNeverOverwrittenOutputsSurvive) {
    Cpu cpu;
    Ctx c(true), r(false);
    std::mt19937 rng(12);
    std::vector<float> xv(96 * 32), yv(96);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float & v : xv) v = d(rng);
    for (float & v : yv) v = d(rng);
    std::vector<oomb_tensor *> outs[2];
    oomb_tensor * ins[2][2];
    oomb_tensor * fins[2];
    oomb_context * ctxs[2] = {c.ctx, r.ctx};
    for (int m = 0; m < 2; m++) {
        oomb_context * ctx = ctxs[m];
        oomb_tensor * x = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 96, 32);
        oomb_tensor * y = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 96);
        oomb_set_input(x);
        oomb_set_input(y);
        ins[m][0] = x;
        ins[m][1] = y;
        // x and y die after their first use and are src[0] of in-place-eligible ops
        oomb_tensor * e = oomb_silu(ctx, x);
        oomb_tensor * yy = oomb_scale(ctx, y, 2.0f);
        for (int i = 0; i < 20; i++) {
            e = oomb_add(ctx, e, yy);
            e = oomb_rms_norm(ctx, e, 1e-5f);
            if (i % 4 == 1) {
                oomb_set_output(e);
                outs[m].push_back(e);
                e = oomb_scale(ctx, e, 0.5f);   // in-place eligible on an OUTPUT: must get a new block
            }
            e = oomb_cont(ctx, oomb_transpose(ctx, oomb_cont(ctx, oomb_transpose(ctx, e))));   // churn
        }
        fins[m] = oomb_sum(ctx, e);
        outs[m].push_back(fins[m]);
    }
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, fins[0]);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    for (oomb_tensor * t : outs[0]) EXPECT_NE(t->data, nullptr);
    check_plan(g, arena_of(g));
    for (int m = 0; m < 2; m++) {
        oomb_tensor_set_f32(ins[m][0], xv.data(), (int64_t) xv.size());
        oomb_tensor_set_f32(ins[m][1], yv.data(), (int64_t) yv.size());
    }
    oomb_backend_graph_compute(cpu.b, g);
    oomb_cgraph * rg = oomb_new_graph(r.ctx);
    oomb_build_forward_expand(rg, fins[1]);
    oomb_backend_graph_compute(cpu.b, rg);
    std::vector<float> x2(xv.size()), y2(yv.size());
    oomb_tensor_get_f32(ins[0][0], x2.data(), (int64_t) x2.size());
    oomb_tensor_get_f32(ins[0][1], y2.data(), (int64_t) y2.size());
    EXPECT_EQ(x2, xv);
    EXPECT_EQ(y2, yv);
    ASSERT_EQ(outs[0].size(), outs[1].size());
    for (size_t i = 0; i < outs[0].size(); i++) expect_close(outs[0][i], outs[1][i]);
    // the OUTPUT tensors and the inputs have blocks of their own (nothing else ever lands on them)
    std::vector<oomb_tensor *> kept = outs[0];
    kept.push_back(ins[0][0]);
    kept.push_back(ins[0][1]);
    // (a tensor produced before a kept one may have used its memory earlier: only later ones are checked)
    std::map<const oomb_tensor *, int> index;
    for (int k = 0; k < oomb_graph_n_nodes(g); k++) index[oomb_graph_node(g, k)] = k;
    for (int k = 0; k < oomb_graph_n_nodes(g); k++) {
        oomb_tensor * n = oomb_graph_node(g, k);
        if (n->view_src) continue;
        for (oomb_tensor * o : kept) {
            if (o == n || (index.count(o) && index[o] > k)) continue;
            const char * ob = (const char *) o->data, * oe = ob + oomb_nbytes(o);
            const char * nb = (const char *) n->data, * ne = nb + oomb_nbytes(n);
            EXPECT_FALSE(nb < oe && ob < ne)
                << "'" << n->name << "' (" << oomb_op_name(n->op) << ") shares memory with a kept tensor (" << oomb_op_name(o->op) << ")";
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensors with data, allocation failure
// ---------------------------------------------------------------------------------------------

TEST(Data, TensorsWithDataAreLeftAlone) {
    Cpu cpu;
    Ctx params(true), host(false), c(true);
    oomb_tensor * w = oomb_new_tensor_2d(params.ctx, OOMB_TYPE_F32, 32, 32);
    oomb_buffer_t pbuf = oomb_backend_alloc_ctx_tensors(params.ctx, cpu.b);
    ASSERT_NE(pbuf, nullptr);
    void * wdata = w->data;
    oomb_tensor * h = oomb_new_tensor_2d(host.ctx, OOMB_TYPE_F32, 32, 32);
    void * hdata = h->data;
    oomb_tensor * leaf = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 32, 32);   // a leaf without data: placed
    oomb_tensor * wv = oomb_view_2d(c.ctx, w, 32, 4, w->nb[1], 0);           // view of a param: already has data
    oomb_tensor * y = oomb_add(c.ctx, oomb_mul_mat(c.ctx, w, h), leaf);
    y = oomb_add(c.ctx, oomb_view_2d(c.ctx, y, 32, 4, y->nb[1], 0), wv);
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, y);
    Galloc ga(cpu.b);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    EXPECT_EQ(w->data, wdata);
    EXPECT_EQ(w->buffer, pbuf);
    EXPECT_EQ(wv->data, wdata);
    EXPECT_EQ(h->data, hdata);
    EXPECT_EQ(h->buffer, nullptr);
    ASSERT_NE(leaf->data, nullptr);
    EXPECT_EQ(leaf->buffer, y->buffer);
    EXPECT_NE(leaf->buffer, pbuf);
    check_plan(g, arena_of(g));
    oomb_buffer_free(pbuf);
}

// A host backend whose allocations can be made to fail.
struct FakeState { bool fail = false; int n_allocs = 0; };
const char * fake_name(oomb_backend_t) { return "fake"; }
bool fake_is_host(oomb_backend_t) { return true; }
void * fake_alloc(oomb_backend_t b, size_t size) {
    auto * st = (FakeState *) b->ctx;
    st->n_allocs++;
    if (st->fail) return nullptr;
    return aligned_alloc(256, (size + 255) / 256 * 256);
}
void fake_free(oomb_backend_t, void * p) { free(p); }
void fake_copy(oomb_backend_t, void * dst, const void * src, size_t n) { memcpy(dst, src, n); }
void fake_memset(oomb_backend_t, void * dst, uint8_t v, size_t n) { memset(dst, v, n); }
void fake_compute(oomb_backend_t, oomb_cgraph *) {}
void fake_free_backend(oomb_backend_t) {}
const oomb_backend_i fake_iface = {fake_name, fake_is_host, fake_alloc, fake_free, fake_copy, fake_copy,
                                   fake_memset, fake_compute, nullptr, fake_free_backend};

TEST(Failure, ArenaAllocationFailureReturnsFalse) {
    FakeState st;
    oomb_backend be{&fake_iface, &st};
    Ctx c(true);
    oomb_tensor * x = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 64, 64);
    oomb_set_input(x);
    oomb_tensor * y = oomb_cont(c.ctx, oomb_transpose(c.ctx, oomb_silu(c.ctx, x)));
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, y);
    Galloc ga(&be);
    st.fail = true;
    EXPECT_FALSE(oomb_gallocr_reserve(ga.ga, g));
    EXPECT_FALSE(oomb_gallocr_alloc_graph(ga.ga, g));
    EXPECT_EQ(oomb_gallocr_buffer_size(ga.ga), 0u);
    EXPECT_EQ(y->data, nullptr);
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 1);   // the plan is kept; only the arena is missing
    st.fail = false;
    EXPECT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga.ga), 1);
    EXPECT_EQ(oomb_gallocr_buffer_size(ga.ga), 3 * 64 * 64 * 4u);
    EXPECT_NE(y->data, nullptr);
    // growing fails too: false, the old arena stays usable
    Ctx c2(true);
    oomb_tensor * big = oomb_new_tensor_1d(c2.ctx, OOMB_TYPE_F32, 1 << 20);
    oomb_set_input(big);
    oomb_cgraph * g2 = oomb_new_graph(c2.ctx);
    oomb_build_forward_expand(g2, oomb_scale(c2.ctx, big, 2.0f));
    st.fail = true;
    EXPECT_FALSE(oomb_gallocr_alloc_graph(ga.ga, g2));
    EXPECT_EQ(oomb_gallocr_buffer_size(ga.ga), 3 * 64 * 64 * 4u);
    st.fail = false;
    EXPECT_TRUE(oomb_gallocr_alloc_graph(ga.ga, g2));
    EXPECT_GE(oomb_gallocr_buffer_size(ga.ga), 2u * 4 * (1 << 20));
}

TEST(Failure, HugeArenaOnTheCpuReturnsFalse) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "AddressSanitizer aborts on a 4 PiB request instead of returning NULL";
#endif
    Cpu cpu;
    Ctx c(true);
    oomb_tensor * x = oomb_new_tensor_3d(c.ctx, OOMB_TYPE_F32, 1 << 20, 1 << 20, 1 << 10);   // 4 PiB
    oomb_set_input(x);
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, oomb_scale(c.ctx, x, 2.0f));
    Galloc ga(cpu.b);
    EXPECT_FALSE(oomb_gallocr_alloc_graph(ga.ga, g));
}

} // namespace

// A view made before its (external) owner got memory is pointed at the owner when the graph is allocated.
TEST(AllocViews, ViewOfExternalTensorAllocatedLater) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    oomb_context * cw = oomb_init({0, true});
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * w = oomb_new_tensor_2d(cw, OOMB_TYPE_F32, 3, 2);
    oomb_tensor * wt = oomb_transpose(ctx, w);  // w has no memory yet
    oomb_tensor * y = oomb_cont(ctx, wt);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, y);
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(cw, cpu);
    const float v[6] = {1, 2, 3, 4, 5, 6};
    oomb_tensor_set(w, v, 0, sizeof(v));
    oomb_gallocr_t ga = oomb_gallocr_new(cpu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    ASSERT_EQ(wt->data, w->data);
    oomb_backend_graph_compute(cpu, g);
    EXPECT_EQ(oomb_get_f32_nd(y, 1, 0, 0, 0), 4.0f);
    EXPECT_EQ(oomb_get_f32_nd(y, 0, 2, 0, 0), 3.0f);
    oomb_gallocr_free(ga);
    oomb_buffer_free(buf);
    oomb_free(ctx);
    oomb_free(cw);
    oomb_backend_free(cpu);
}

// Computing (or filling) a graph after its allocator planned a bigger graph, or was freed, is an
// error instead of silent use of reallocated memory.
TEST(AllocStale, GraphAfterAllocatorMovedOn) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * xa = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 16);
    oomb_set_input(xa);
    oomb_cgraph * ga_graph = oomb_new_graph(ctx);
    oomb_build_forward_expand(ga_graph, oomb_scale(ctx, xa, 2.0f));
    oomb_tensor * xb = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 1 << 16);
    oomb_set_input(xb);
    oomb_cgraph * gb = oomb_new_graph(ctx);
    oomb_build_forward_expand(gb, oomb_scale(ctx, oomb_scale(ctx, xb, 2.0f), 3.0f));
    oomb_gallocr_t ga = oomb_gallocr_new(cpu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, ga_graph));
    std::vector<float> in(16, 1.0f);
    oomb_tensor_set_f32(xa, in.data(), 16);
    oomb_backend_graph_compute(cpu, ga_graph);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, gb));  // the arena grows: graph A's memory is gone
    EXPECT_OOMB_ERROR(oomb_tensor_set_f32(xa, in.data(), 16), "points outside its buffer");
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cpu, ga_graph), "call oomb_gallocr_alloc_graph on this graph again");
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, ga_graph));  // re-placing A makes it usable again
    oomb_tensor_set_f32(xa, in.data(), 16);
    oomb_backend_graph_compute(cpu, ga_graph);
    EXPECT_EQ(oomb_get_f32_1d(oomb_graph_node(ga_graph, -1), 3), 2.0f);
    oomb_gallocr_free(ga);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cpu, ga_graph), "been freed");
    oomb_free(ctx);
    oomb_backend_free(cpu);
}

// Flagging a tensor OUTPUT after the graph was planned makes the next alloc_graph plan again and
// keep that tensor alive to the end.
TEST(AllocFlags, OutputFlagSetAfterPlanningReplans) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * x = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 256);
    oomb_set_input(x);
    oomb_tensor * a = oomb_scale(ctx, x, 2.0f);
    oomb_tensor * y = a;
    for (int i = 0; i < 6; i++) y = oomb_scale(ctx, oomb_add(ctx, y, x), 0.5f);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, y);
    oomb_gallocr_t ga = oomb_gallocr_new(cpu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga), 1);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga), 1);
    oomb_set_output(a);  // now a must survive the whole graph
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    EXPECT_EQ(oomb_gallocr_n_plans(ga), 2);
    std::vector<float> in(256);
    for (int i = 0; i < 256; i++) in[i] = 0.25f * (float) (i % 17) - 1.0f;
    oomb_tensor_set_f32(x, in.data(), 256);
    oomb_backend_graph_compute(cpu, g);
    for (int i = 0; i < 256; i++) ASSERT_EQ(oomb_get_f32_1d(a, i), 2.0f * in[i]) << i;
    oomb_gallocr_free(ga);
    oomb_free(ctx);
    oomb_backend_free(cpu);
}

// The backward appends each parameter's accumulation as soon as its gradient is complete, so a
// layer's weight-gradient product runs right after that layer's backward instead of after the
// whole backward pass (which kept every layer's activations and output gradients alive): in a
// residual chain of L linear layers, W_{L-1}'s accumulation comes before the product that carries the
// gradient into layer 0, and the planned arena of a deep chain stays far below keeping all
// layers' backward tensors.
TEST(Alloc, BackwardAccumulatesEachWeightEarly) {
    const int L = 12, d = 64, n = 256;
    oomb_context * wctx = oomb_init({0, true});  // weights (and gradients): their own buffer
    oomb_context * ctx = oomb_init({0, true});   // the graph: planned by the allocator
    oomb_tensor * x = oomb_set_name(oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, d, n), "x");
    oomb_set_input(x);
    std::vector<oomb_tensor *> W(L);
    oomb_tensor * h = x;
    std::vector<oomb_tensor *> outs;
    for (int l = 0; l < L; l++) {
        W[l] = oomb_format_name(oomb_new_tensor_2d(wctx, OOMB_TYPE_F32, d, d), "W%d", l);
        oomb_set_param(W[l]);
        oomb_new_grad(wctx, W[l]);
        // residual: the forward DFS reaches the first layer's weights first (as in a transformer),
        // so accumulating in parameter order would put W0's (and with it the whole backward) first
        h = oomb_format_name(oomb_add(ctx, h, oomb_silu(ctx, oomb_mul_mat(ctx, W[l], h))), "h%d", l);
        outs.push_back(h);
    }
    oomb_tensor * loss = oomb_sum_sq(ctx, h);
    oomb_set_loss(loss);
    oomb_cgraph * g = oomb_new_graph_custom(ctx, 4096);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(ctx, g, loss, nullptr);
    auto index_of = [&](const char * name) {
        for (int i = 0; i < oomb_graph_n_nodes(g); i++)
            if (!strcmp(oomb_graph_node(g, i)->name, name)) return i;
        return -1;
    };
    const std::string last_acc = std::string(W[L - 1]->grad->name) + " (accumulate)";
    const std::string first_acc = std::string(W[0]->grad->name) + " (accumulate)";
    const int i_last = index_of(last_acc.c_str()), i_first = index_of(first_acc.c_str());
    const int i_dh0 = index_of("grad of h0");
    ASSERT_GE(i_last, 0) << last_acc;
    ASSERT_GE(i_first, 0) << first_acc;
    ASSERT_GE(i_dh0, 0);
    EXPECT_LT(i_last, i_dh0) << "the last layer's weight gradient should be accumulated before the backward reaches layer 0";
    EXPECT_GT(i_first, i_dh0);
    // planned arena, a sanity bound: the forward activations (L x 3 tensors of n*d f32) dominate
    // (here the weight gradients are small, so early accumulation saves little: 26 vs 27
    // activations; in Qwen2 it saves gigabytes, see Qwen2Memory tests)
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    oomb_buffer_t wbuf = oomb_backend_alloc_ctx_tensors(wctx, cpu);
    oomb_gallocr_t ga = oomb_gallocr_new(cpu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    const size_t act = (size_t) n * d * sizeof(float);
    printf("planned arena %.2f activations of [%d, %d] f32 for %d layers\n", (double) oomb_gallocr_planned_size(ga) / act, d, n, L);
    EXPECT_LT(oomb_gallocr_planned_size(ga), (size_t) (3 * L + 8) * act) << "planned " << oomb_gallocr_planned_size(ga);
    oomb_gallocr_free(ga);
    oomb_buffer_free(wbuf);
    oomb_backend_free(cpu);
    oomb_free(ctx);
    oomb_free(wctx);
}
