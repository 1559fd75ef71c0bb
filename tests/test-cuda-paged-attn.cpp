// CUDA paged flash attention (cuda/paged-attn.cu) against the CPU reference kernels on random data:
// forward (with and without storing the chunk's K/V), backward (dq, dK/dV accumulated into the f32
// gradient pages, dk_cur/dv_cur read back), over head dims 64/128,
// page sizes 64/128, GQA groups 28/4, 14/2, 4/4, chunks of 1, 37 and 256 tokens after histories
// of 0, 1000 and 5000 positions, with a shuffled page table. The kernels are called directly on device tensors (no CUDA backend
// needed). Every test skips with a visible reason where no GPU is present.
// oomb_paged_attn's node is packed (out [D, H, T], then each row's log-sum-exp) and the op returns
// a view of its out part: the forward kernel runs on the packed node, the saved LSE is compared
// with the CPU's, and the backward runs twice from the same gradient pages: with the forward's
// saved statistics (fwd given, what autodiff builds) and recomputing them (fwd NULL).
// Page schedules (oomb-schedule.h): page ranges and page lists on every kernel family that takes
// them (ranges: all; lists: all, the tensor-core kernels for page sizes that are multiples of 64,
// the generic ones otherwise), and each case checks that the dispatcher ran the kernel family it
// should (oomb_cuda_paged_attn_last_family).
// Kernel choices are set through oomb_cuda_paged_attn_set_config (ConfigScope), not the environment.
// Blocks that accumulate into an earlier result (oomb_paged_attn_args.accumulate, the offload
// engine's page blocks) on every family, forward and backward, against the CPU's one call.
// Merges, bf16 gradient pages and NaN inputs: test-cuda-paged-attn-numerics.cpp; the harness (Case,
// launchers, device memory, error measures): cuda-paged-attn-harness.h.

#include "cuda-paged-attn-harness.h"

#include <unistd.h>  // environ

namespace {

#ifdef OOMB_USE_CUDA


void run_case(const Case & c, uint32_t seed) {
    SCOPED_TRACE(case_name(c));
    std::mt19937 rng(seed);
    const int n_pos = c.hist + c.T;
    const int n_need = (n_pos + c.P - 1) / c.P;
    const int n_logical = n_need + 2;   // unmapped tail
    const int n_pages = n_need + 3;     // spare physical pages
    const float scale = c.scale_mul / std::sqrt((float) c.D);

    // ---- CPU tensors with random data ----
    oomb_context * hc = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.H, c.T);
    oomb_tensor * kc = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.T);
    oomb_tensor * vc = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.T);
    oomb_tensor * kp = oomb_new_tensor_4d(hc, c.type, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * vp = oomb_new_tensor_4d(hc, c.type, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * dkp = oomb_new_tensor_4d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * dvp = oomb_new_tensor_4d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * pt = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, n_logical);
    oomb_tensor * pos = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, c.T);
    oomb_tensor * dout = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.H, c.T);
    oombtest::fill_uniform(q, rng, -2.0f, 2.0f);
    oombtest::fill_uniform(kc, rng, -1.0f, 1.0f);
    oombtest::fill_uniform(vc, rng, -1.0f, 1.0f);
    oombtest::fill_uniform(kp, rng, -1.0f, 1.0f);
    oombtest::fill_uniform(vp, rng, -1.0f, 1.0f);
    oombtest::fill_uniform(dkp, rng, -0.5f, 0.5f);
    oombtest::fill_uniform(dvp, rng, -0.5f, 0.5f);
    oombtest::fill_uniform(dout, rng, -1.0f, 1.0f);
    std::vector<int> perm(n_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n_logical; i++) ((int32_t *) pt->data)[i] = i < n_need ? perm[i] : -1;
    if (c.poison_tail) {
        // NaN (bf16 / f16 / f32 all-ones exponent) in every pool slot no position maps to
        std::vector<bool> used((size_t) n_pages * c.P, false);
        for (int p = 0; p < n_pos; p++) used[(size_t) perm[p / c.P] * c.P + p % c.P] = true;
        const size_t esz = oomb_type_size(c.type), row = (size_t) c.D * c.Hkv * esz;
        for (size_t slot = 0; slot < used.size(); slot++) {
            if (used[slot]) continue;
            memset((char *) kp->data + slot * row, 0xff, row);
            memset((char *) vp->data + slot * row, 0xff, row);
        }
    }
    std::vector<int> pv(c.T);
    std::iota(pv.begin(), pv.end(), c.hist);
    if (c.shuffle_pos) std::shuffle(pv.begin(), pv.end(), rng);
    for (int t = 0; t < c.T; t++) ((int32_t *) pos->data)[t] = pv[t];

    // the schedule: a range from the middle of the history through the current region (every row
    // sees its own key), or random lists (tile 0 every history page, the others about a third)
    const int c0 = pv.empty() ? 0 : c.hist / c.P, n_qt = c.T ? (n_pos - 1) / c.P - c0 + 1 : 1;
    oomb_tensor * s_off = nullptr, * s_pg = nullptr, * s_io = nullptr, * s_iq = nullptr;
    if (oomb_schedule_has_lists(c.sched)) random_lists(hc, rng, c0, n_qt, c.lists_mode, s_off, s_pg, s_io, s_iq);
    const int win_first = c.range_first >= 0 ? c.range_first : c0 / 2;
    const int win_last = c.range_last >= 0 ? c.range_last : std::max(c.range_first, (n_pos - 1) / c.P + 1);
    auto schedule = [&](oomb_tensor * o, oomb_tensor * p, oomb_tensor * io, oomb_tensor * iq) {
        if (c.sched == OOMB_SCHEDULE_RANGE) return oomb_schedule_range(win_first, win_last);
        if (c.sched == OOMB_SCHEDULE_LISTS) return oomb_schedule_lists(o, p, io, iq);
        if (c.sched == OOMB_SCHEDULE_LISTS_RANGE)  // the offload's block of a sparse history: the lists inside a window
            return oomb_schedule_lists_range(o, p, io, iq, win_first, win_last);
        return oomb_schedule_dense();
    };
    auto fwd_op = [&](oomb_context * x, oomb_tensor * q_, oomb_tensor * kc_, oomb_tensor * vc_, oomb_tensor * kp_, oomb_tensor * vp_,
                      oomb_tensor * pt_, oomb_tensor * pos_, const oomb_page_schedule & sc) {
        oomb_paged_attn_args a{};
        a.q = q_; a.k_cur = kc_; a.v_cur = vc_; a.k_pages = kp_; a.v_pages = vp_; a.page_table = pt_; a.pos = pos_;
        a.schedule = sc; a.scale = scale; a.store = c.store;
        return oomb_paged_attn_ext(x, &a);  // view of the packed node
    };
    auto back_op = [&](oomb_context * x, oomb_tensor * q_, oomb_tensor * kp_, oomb_tensor * vp_, oomb_tensor * dkp_, oomb_tensor * dvp_,
                       oomb_tensor * pt_, oomb_tensor * pos_, oomb_tensor * dout_, oomb_tensor * fwd_, const oomb_page_schedule & sc) {
        oomb_paged_attn_args a{};
        a.q = q_; a.k_pages = kp_; a.v_pages = vp_; a.dk_pages = dkp_; a.dv_pages = dvp_; a.page_table = pt_; a.pos = pos_;
        a.dout = dout_; a.fwd = fwd_; a.schedule = sc; a.scale = scale;
        return oomb_paged_attn_back_ext(x, &a);
    };
    const oomb_page_schedule h_sched = schedule(s_off, s_pg, s_io, s_iq);
    oomb_tensor * out = fwd_op(hc, q, kc, vc, kp, vp, pt, pos, h_sched);
    oomb_tensor * back = back_op(hc, q, kp, vp, dkp, dvp, pt, pos, dout, out, h_sched);

    // ---- device copies (no_alloc context, data set by hand) ----
    oomb_context * dc = oomb_init({0, true});
    DevMem mem;
    auto dev = [&](const oomb_tensor * h) { return mem.copy_of(dc, h); };
    oomb_tensor * d_q = dev(q), * d_kc = dev(kc), * d_vc = dev(vc), * d_kp = dev(kp), * d_vp = dev(vp);
    oomb_tensor * d_dkp = dev(dkp), * d_dvp = dev(dvp), * d_pt = dev(pt), * d_pos = dev(pos), * d_dout = dev(dout);
    oomb_tensor * d_off = s_off ? dev(s_off) : nullptr, * d_pg = s_pg ? dev(s_pg) : nullptr;
    oomb_tensor * d_io = s_io ? dev(s_io) : nullptr, * d_iq = s_iq ? dev(s_iq) : nullptr;
    const oomb_page_schedule d_sched = schedule(d_off, d_pg, d_io, d_iq);
    oomb_tensor * d_out = fwd_op(dc, d_q, d_kc, d_vc, d_kp, d_vp, d_pt, d_pos, d_sched);
    oomb_tensor * d_packed = d_out->view_src;  // the op's node: out, then the LSE of each row
    oomb_tensor * d_back = back_op(dc, d_q, d_kp, d_vp, d_dkp, d_dvp, d_pt, d_pos, d_dout, d_out, d_sched);
    oomb_tensor * d_back_re = back_op(dc, d_q, d_kp, d_vp, d_dkp, d_dvp, d_pt, d_pos, d_dout, nullptr, d_sched);
    ASSERT_EQ(oomb_paged_attn_args_of(d_back).fwd, d_packed);
    ASSERT_EQ(oomb_paged_attn_args_of(d_back_re).fwd, nullptr);
    mem.place(d_packed, nullptr);
    d_out->data = d_packed->data;  // no_alloc context: the view's data is set by hand too
    mem.place(d_back, nullptr);
    mem.place(d_back_re, nullptr);
    if (mem.failed) { oomb_free(dc); oomb_free(hc); return; }

    const std::vector<float> dk0 = host_f32(dkp), dv0 = host_f32(dvp);
    const double tol = c.type == OOMB_TYPE_F32 ? 1e-3 : 3e-2;

    // ---- forward ----
    {
        oomb_cgraph * g = oomb_new_graph(hc);
        oomb_build_forward_expand(g, out);
        oomb_backend_graph_compute(cpu(), g);
    }
    launch_fwd(d_packed);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(std::string(oomb_cuda_paged_attn_last_family(0)), expected_family(c, 0)) << "forward kernel family";
    const int64_t nq = (int64_t) c.D * c.H * c.T, nkv = (int64_t) c.D * c.Hkv * c.T;
    auto part = [](const std::vector<float> & v, int64_t b, int64_t n) { return std::vector<float>(v.begin() + b, v.begin() + b + n); };
    const std::vector<float> gp = dev_f32(d_packed), cp = host_f32(out->view_src);
    const double e_out = rel_err(part(gp, 0, nq), part(cp, 0, nq));
    // the LSE: a row that sees no key (a page range after it) is -inf on both sides; the rest by value
    std::vector<float> lse_g, lse_c;
    int lse_inf_mismatch = 0, lse_no_key = 0;
    for (int64_t i = nq; i < nq + (int64_t) c.H * c.T; i++) {
        if (cp[i] == -INFINITY) {
            lse_no_key++;
            lse_inf_mismatch += gp[i] != -INFINITY;
        } else {
            lse_g.push_back(gp[i]);
            lse_c.push_back(cp[i]);
        }
    }
    EXPECT_EQ(lse_inf_mismatch, 0) << "rows without keys (" << lse_no_key << "): LSE -inf";
    EXPECT_TRUE(c.sched == OOMB_SCHEDULE_RANGE || c.sched == OOMB_SCHEDULE_LISTS_RANGE || lse_no_key == 0) << "only a page range leaves rows without keys";
    const double e_lse = lse_c.empty() ? 0.0 : rel_err(lse_g, lse_c);
    // the pools: NaN where both hold the poison (poison_tail), else by value
    auto pool_err = [](std::vector<float> a, std::vector<float> b) {
        for (size_t i = 0; i < a.size() && i < b.size(); i++)
            if (std::isnan(a[i]) && std::isnan(b[i])) a[i] = b[i] = 0.0f;
        return rel_err(a, b);
    };
    const double e_kp = pool_err(dev_pool_f32(d_kp), host_pool_f32(kp));
    const double e_vp = pool_err(dev_pool_f32(d_vp), host_pool_f32(vp));
    EXPECT_LT(e_out, tol) << "forward output: " << worst(part(gp, 0, nq), part(cp, 0, nq), c.D, c.H) << " [family "
                          << oomb_cuda_paged_attn_last_family(0) << "]";
    {
        // largest single error against the largest reference value: a wrong mask or a skipped key
        // tile changes whole rows, which the relative L2 error over all rows could dilute
        double mx_err = 0, mx_ref = 0;
        for (int64_t i = 0; i < nq; i++) {
            mx_err = std::max(mx_err, std::fabs((double) gp[i] - cp[i]));
            mx_ref = std::max(mx_ref, std::fabs((double) cp[i]));
        }
        EXPECT_LE(mx_err, tol * mx_ref) << "forward output: largest element error " << mx_err << " (largest |ref| " << mx_ref << ")";
    }
    EXPECT_LT(e_lse, tol) << "forward's saved log-sum-exp";
    EXPECT_LT(e_kp, 1e-6) << "K pool after store";
    EXPECT_LT(e_vp, 1e-6) << "V pool after store";

    // ---- backward ----
    {
        oomb_cgraph * g = oomb_new_graph(hc);
        oomb_build_forward_expand(g, back);
        oomb_backend_graph_compute(cpu(), g);
    }
    const std::vector<float> cb = host_f32(back);
    // increments of the gradient pages (the initial random contents cancel)
    auto inc = [](std::vector<float> v, const std::vector<float> & v0) { for (size_t i = 0; i < v.size(); i++) v[i] -= v0[i]; return v; };
    const std::vector<float> cdk = inc(host_f32(dkp), dk0), cdv = inc(host_f32(dvp), dv0);
    printf("[ case ] %-48s out %.2e  lse %.2e  pools %.1e/%.1e\n", case_name(c).c_str(), e_out, e_lse, e_kp, e_vp);
    // the GPU backward with the saved statistics, then (from the same gradient pages) recomputing them
    for (oomb_tensor * db : {d_back, d_back_re}) {
        const char * what = oomb_paged_attn_args_of(db).fwd ? "saved" : "recomputed";
        SCOPED_TRACE(std::string("backward with ") + what + " statistics");
        CK(cudaMemcpy(d_dkp->data, dk0.data(), dk0.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_dvp->data, dv0.data(), dv0.size() * sizeof(float), cudaMemcpyHostToDevice));
        launch_bwd(db);
        CK(cudaDeviceSynchronize());
        EXPECT_EQ(std::string(oomb_cuda_paged_attn_last_family(1)), expected_family(c, 1)) << "backward kernel family";
        const std::vector<float> gb = dev_f32(db);
        const double e_dq = rel_err(part(gb, 0, nq), part(cb, 0, nq));
        const double e_dkc = rel_err(part(gb, nq, nkv), part(cb, nq, nkv));
        const double e_dvc = rel_err(part(gb, nq + nkv, nkv), part(cb, nq + nkv, nkv));
        const double e_dkp = rel_err(inc(dev_f32(d_dkp), dk0), cdk);
        const double e_dvp = rel_err(inc(dev_f32(d_dvp), dv0), cdv);
        const std::string fam = std::string(" [family ") + oomb_cuda_paged_attn_last_family(1) + "]";
        EXPECT_LT(e_dq, tol) << "dq: " << worst(part(gb, 0, nq), part(cb, 0, nq), c.D, c.H) << fam;
        EXPECT_LT(e_dkc, tol) << "dk_cur: " << worst(part(gb, nq, nkv), part(cb, nq, nkv), c.D, c.Hkv) << fam;
        EXPECT_LT(e_dvc, tol) << "dv_cur: " << worst(part(gb, nq + nkv, nkv), part(cb, nq + nkv, nkv), c.D, c.Hkv) << fam;
        EXPECT_LT(e_dkp, tol) << "dK pages increment (row = physical page * P + slot): " << worst(inc(dev_f32(d_dkp), dk0), cdk, c.D, c.Hkv) << fam;
        EXPECT_LT(e_dvp, tol) << "dV pages increment (row = physical page * P + slot): " << worst(inc(dev_f32(d_dvp), dv0), cdv, c.D, c.Hkv) << fam;
        printf("[ case ]   backward, %-10s statistics: dq %.2e  dk_cur %.2e  dv_cur %.2e  dKpages %.2e  dVpages %.2e\n", what, e_dq,
               e_dkc, e_dvc, e_dkp, e_dvp);
    }
    fflush(stdout);
    oomb_free(dc);
    oomb_free(hc);
}

// oomb_paged_attn_cached on the GPU: a save then a load of the chunk's block (pos0 .. pos0 + T - 1)
// in a cache of `ct` poisoned with 0xffff elements. Checks the loaded result (bf16: out rounded to
// nearest even, the LSE bit for bit; f32: identical), the block's layout in the cache (the same
// definition as the CPU's: out, then each LSE as f32 bits) and that nothing outside it is written.
void run_cache_case(int D, int H, int Hkv, int T, int pos0, int P, oomb_type pool, oomb_type ct, uint32_t seed) {
    char name[160];
    snprintf(name, sizeof(name), "cache D%d H%d/%d T%d pos0 %d page %d pool %s cache %s", D, H, Hkv, T, pos0, P, oomb_type_name(pool),
             oomb_type_name(ct));
    SCOPED_TRACE(name);
    std::mt19937 rng(seed);
    const int n_pos = pos0 + T + 3, n_pages = (n_pos + P - 1) / P;
    oomb_context * hc = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * kc = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * vc = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * kp = oomb_new_tensor_4d(hc, pool, D, Hkv, P, n_pages);
    oomb_tensor * vp = oomb_new_tensor_4d(hc, pool, D, Hkv, P, n_pages);
    oomb_tensor * pt = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, n_pages);
    oomb_tensor * pos = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, T);
    const int64_t row = oomb_paged_attn_cache_row(D, H, ct);
    oomb_tensor * cache = oomb_new_tensor_1d(hc, ct, row * n_pos);
    for (oomb_tensor * t : {q, kc, vc, kp, vp}) oombtest::fill_uniform(t, rng, -1.0f, 1.0f);
    for (int i = 0; i < n_pages; i++) ((int32_t *) pt->data)[i] = n_pages - 1 - i;
    for (int t = 0; t < T; t++) ((int32_t *) pos->data)[t] = pos0 + t;
    memset(cache->data, 0xff, oomb_nbytes(cache));

    oomb_context * dc = oomb_init({0, true});
    DevMem mem;
    auto dev = [&](const oomb_tensor * h) { return mem.copy_of(dc, h); };
    oomb_tensor * d_q = dev(q), * d_kc = dev(kc), * d_vc = dev(vc), * d_kp = dev(kp), * d_vp = dev(vp), * d_pt = dev(pt), * d_pos = dev(pos);
    oomb_tensor * d_cache = dev(cache);
    oomb_tensor * save = oomb_paged_attn_cached(dc, d_q, d_kc, d_vc, d_kp, d_vp, d_pt, d_pos, 0.3f, 1, d_cache, 0)->view_src;
    oomb_tensor * load = oomb_paged_attn_cached(dc, d_q, d_kc, d_vc, d_kp, d_vp, d_pt, d_pos, 0.3f, 0, d_cache, 1)->view_src;
    mem.place(save, nullptr);
    mem.place(load, nullptr);
    if (mem.failed) { oomb_free(dc); oomb_free(hc); return; }
    launch_fwd(save);
    launch_fwd(load);
    CK(cudaDeviceSynchronize());
    const std::vector<float> vs = dev_f32(save), vl = dev_f32(load);
    std::vector<uint16_t> cb(oomb_nbytes(cache) / 2);
    CK(cudaMemcpy(cb.data(), d_cache->data, oomb_nbytes(cache), cudaMemcpyDeviceToHost));
    const int64_t n_out = (int64_t) D * H * T, n_lse = (int64_t) H * T;
    const int64_t esz = ct == OOMB_TYPE_BF16 ? 1 : 2;  // 16-bit units per cache element
    const int64_t b0 = (int64_t) pos0 * row * esz, b1 = (int64_t) (pos0 + T) * row * esz;  // the block, 16-bit units
    int bad_load = 0, bad_layout = 0, outside = 0;
    for (int64_t i = 0; i < n_out + n_lse; i++) {
        uint32_t want;
        if (i < n_out && ct == OOMB_TYPE_BF16) {
            const uint16_t h = oomb_fp32_to_bf16(vs[i]);
            const float r = oomb_bf16_to_fp32(h);
            memcpy(&want, &r, 4);
            bad_layout += cb[b0 + i] != h;
        } else {
            memcpy(&want, &vs[i], 4);
            const int64_t u = b0 + (i < n_out ? 2 * i : (ct == OOMB_TYPE_BF16 ? n_out + 2 * (i - n_out) : 2 * i));
            bad_layout += ((uint32_t) cb[u] | ((uint32_t) cb[u + 1] << 16)) != want;
        }
        uint32_t got;
        memcpy(&got, &vl[i], 4);
        bad_load += got != want;
    }
    for (int64_t u = 0; u < (int64_t) cb.size(); u++)
        if (u < b0 || u >= b1) outside += cb[u] != 0xffff;
    EXPECT_EQ(bad_load, 0) << "loaded block vs the saved result (bf16: out rounded, LSE exact)";
    EXPECT_EQ(bad_layout, 0) << "the block's layout in the cache";
    EXPECT_EQ(outside, 0) << "cache elements written outside the block";
    // the block written and read is exactly (pos0 + T) * row - pos0 * row elements: the last
    // element of the block was written (not poison)
    EXPECT_NE(cb[b1 - 1], 0xffff);
    printf("[ cache ] %s: load %d, layout %d, outside %d mismatches\n", name, bad_load, bad_layout, outside);
    oomb_free(dc);
    oomb_free(hc);
}

// accumulate = 1 (oomb_paged_attn_args: the host-offload engine's page blocks) on the GPU against
// the CPU's one-call result: the chunk's own pages first (RANGE / LISTS_RANGE [c0, end): writes out
// and LSE), then history windows [c0 / 2, c0) and [0, c0 / 2) and an empty one, each a separate
// node accumulating into the first node's memory (the forward merges in its kernel epilogue); the
// backward likewise (built with the accumulated forward as its saved statistics, the schedule patched
// per block as the engine does: the first call writes dq and reads dk_cur / dv_cur back, the others
// add dq only). c.sched: DENSE (blocks as RANGE) or LISTS (blocks as LISTS_RANGE).
void run_accum_case(const Case & c, uint32_t seed) {
    SCOPED_TRACE("accumulate " + case_name(c));
    std::mt19937 rng(seed);
    const int n_pos = c.hist + c.T, n_need = (n_pos + c.P - 1) / c.P, n_pages = n_need + 3;
    const float scale = 1.0f / std::sqrt((float) c.D);
    const bool lists = c.sched == OOMB_SCHEDULE_LISTS;
    oomb_context * hc = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.H, c.T);
    oomb_tensor * kc = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.T), * vc = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.T);
    oomb_tensor * kp = oomb_new_tensor_4d(hc, c.type, c.D, c.Hkv, c.P, n_pages), * vp = oomb_new_tensor_4d(hc, c.type, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * dkp = oomb_new_tensor_4d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.P, n_pages), * dvp = oomb_new_tensor_4d(hc, OOMB_TYPE_F32, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * pt = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, n_need), * pos = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, c.T);
    oomb_tensor * dout = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.H, c.T);
    for (oomb_tensor * t : {q, dout}) oombtest::fill_uniform(t, rng, -2.0f, 2.0f);
    for (oomb_tensor * t : {kc, vc, kp, vp}) oombtest::fill_uniform(t, rng, -1.0f, 1.0f);
    for (oomb_tensor * t : {dkp, dvp}) oombtest::fill_uniform(t, rng, -0.5f, 0.5f);
    std::vector<int> perm(n_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n_need; i++) ((int32_t *) pt->data)[i] = perm[i];
    for (int t = 0; t < c.T; t++) ((int32_t *) pos->data)[t] = c.hist + t;
    const int c0 = c.hist / c.P, n_qt = (n_pos - 1) / c.P - c0 + 1;
    oomb_tensor * s_off = nullptr, * s_pg = nullptr, * s_io = nullptr, * s_iq = nullptr;
    if (lists) random_lists(hc, rng, c0, n_qt, 0, s_off, s_pg, s_io, s_iq);  // tile 0 every history page, the others about a third
    auto sched = [&](oomb_tensor * o, oomb_tensor * p, oomb_tensor * io, oomb_tensor * iq) {
        return lists ? oomb_schedule_lists(o, p, io, iq) : oomb_schedule_dense();
    };
    auto fwd_op = [&](oomb_context * x, oomb_tensor * const * t, const oomb_page_schedule & sc, int acc) {
        oomb_paged_attn_args a{};
        a.q = t[0]; a.k_cur = t[1]; a.v_cur = t[2]; a.k_pages = t[3]; a.v_pages = t[4]; a.page_table = t[5]; a.pos = t[6];
        a.schedule = sc; a.scale = scale; a.accumulate = acc;
        return oomb_paged_attn_ext(x, &a)->view_src;  // the packed node
    };
    auto back_op = [&](oomb_context * x, oomb_tensor * const * t, oomb_tensor * dk, oomb_tensor * dv, oomb_tensor * dout_, oomb_tensor * fwd,
                       const oomb_page_schedule & sc, int acc) {
        oomb_paged_attn_args a{};
        a.q = t[0]; a.k_pages = t[3]; a.v_pages = t[4]; a.page_table = t[5]; a.pos = t[6];
        a.dk_pages = dk; a.dv_pages = dv; a.dout = dout_; a.fwd = fwd; a.schedule = sc; a.scale = scale; a.accumulate = acc;
        return oomb_paged_attn_back_ext(x, &a);
    };
    oomb_tensor * const ht[7] = {q, kc, vc, kp, vp, pt, pos};
    const oomb_page_schedule hs = sched(s_off, s_pg, s_io, s_iq);
    oomb_tensor * out = fwd_op(hc, ht, hs, 0);
    oomb_tensor * back = back_op(hc, ht, dkp, dvp, dout, out, hs, 0);
    const std::vector<float> dk0 = host_f32(dkp), dv0 = host_f32(dvp);
    for (oomb_tensor * t : {out, back}) {
        oomb_cgraph * g = oomb_new_graph(hc);
        oomb_build_forward_expand(g, t);
        oomb_backend_graph_compute(cpu(), g);
    }

    oomb_context * dc = oomb_init({0, true});
    DevMem mem;
    oomb_tensor * dt[7];
    for (int i = 0; i < 7; i++) dt[i] = mem.copy_of(dc, ht[i]);
    oomb_tensor * d_dkp = mem.copy_of(dc, dkp), * d_dvp = mem.copy_of(dc, dvp), * d_dout = mem.copy_of(dc, dout);
    oomb_tensor * d_off = lists ? mem.copy_of(dc, s_off) : nullptr, * d_pg = lists ? mem.copy_of(dc, s_pg) : nullptr;
    oomb_tensor * d_io = lists ? mem.copy_of(dc, s_io) : nullptr, * d_iq = lists ? mem.copy_of(dc, s_iq) : nullptr;
    const oomb_page_schedule ds = sched(d_off, d_pg, d_io, d_iq);
    const int32_t windows[4][2] = {{c0, n_need}, {c0 / 2, c0}, {0, c0 / 2}, {n_need, n_need}};
    const int32_t bkind = lists ? OOMB_SCHEDULE_LISTS_RANGE : OOMB_SCHEDULE_RANGE;
    auto patch = [&](oomb_tensor * t, int b) {
        t->op_params[oomb::PA_PARAM_SCHED_KIND] = bkind;
        t->op_params[oomb::PA_PARAM_SCHED_FIRST] = windows[b][0];
        t->op_params[oomb::PA_PARAM_SCHED_LAST] = windows[b][1];
    };
    oomb_tensor * d_node = fwd_op(dc, dt, ds, 0);
    oomb_tensor * d_back = back_op(dc, dt, d_dkp, d_dvp, d_dout, d_node, ds, 0);
    mem.place(d_node, nullptr);
    mem.place(d_back, nullptr);
    if (mem.failed) { oomb_free(dc); oomb_free(hc); return; }
    const double tol = c.type == OOMB_TYPE_F32 ? 1e-3 : 3e-2;
    const int64_t nq = (int64_t) c.D * c.H * c.T, nkv = (int64_t) c.D * c.Hkv * c.T;
    auto part = [](const std::vector<float> & v, int64_t b, int64_t n) { return std::vector<float>(v.begin() + b, v.begin() + b + n); };
    int32_t saved[3];  // d_node's own schedule, restored after its block (the engine does the same)
    for (int k = 0; k < 3; k++) saved[k] = d_node->op_params[oomb::PA_PARAM_SCHED_KIND + k];
    for (int b = 0; b < 4; b++) {
        oomb_tensor * t = b == 0 ? d_node : fwd_op(dc, dt, ds, 1);
        t->data = d_node->data;
        patch(t, b);
        launch_fwd(t);
    }
    for (int k = 0; k < 3; k++) d_node->op_params[oomb::PA_PARAM_SCHED_KIND + k] = saved[k];
    const std::vector<float> gf = dev_f32(d_node), cf = host_f32(out);
    EXPECT_LT(rel_err(part(gf, 0, nq), part(cf, 0, nq)), tol) << "accumulated out: " << worst(part(gf, 0, nq), part(cf, 0, nq), c.D, c.H);
    EXPECT_LT(rel_err(part(gf, nq, (int64_t) c.H * c.T), part(cf, nq, (int64_t) c.H * c.T)), tol) << "accumulated LSE";
    // the gradient pages as they were before the CPU's backward added to them
    CK(cudaMemcpy(d_dkp->data, dk0.data(), dk0.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dvp->data, dv0.data(), dv0.size() * sizeof(float), cudaMemcpyHostToDevice));
    for (int b = 0; b < 4; b++) {
        oomb_tensor * t = b == 0 ? d_back : back_op(dc, dt, d_dkp, d_dvp, d_dout, d_node, ds, 1);
        t->data = d_back->data;
        patch(t, b);
        launch_bwd(t);
    }
    const std::vector<float> gb = dev_f32(d_back), cb = host_f32(back);
    auto inc = [](std::vector<float> v, const std::vector<float> & v0) { for (size_t i = 0; i < v.size(); i++) v[i] -= v0[i]; return v; };
    const double e_dq = rel_err(part(gb, 0, nq), part(cb, 0, nq)), e_dkc = rel_err(part(gb, nq, nkv), part(cb, nq, nkv));
    const double e_dvc = rel_err(part(gb, nq + nkv, nkv), part(cb, nq + nkv, nkv));
    const double e_dkp = rel_err(inc(dev_f32(d_dkp), dk0), inc(host_f32(dkp), dk0)), e_dvp = rel_err(inc(dev_f32(d_dvp), dv0), inc(host_f32(dvp), dv0));
    EXPECT_LT(e_dq, tol) << "accumulated dq: " << worst(part(gb, 0, nq), part(cb, 0, nq), c.D, c.H);
    EXPECT_LT(e_dkc, tol) << "dk_cur";
    EXPECT_LT(e_dvc, tol) << "dv_cur";
    EXPECT_LT(e_dkp, tol) << "dK pages";
    EXPECT_LT(e_dvp, tol) << "dV pages";
    printf("[ accum ] %-48s family %s/%s: dq %.2e dk_cur %.2e dv_cur %.2e dK %.2e dV %.2e\n", case_name(c).c_str(),
           oomb_cuda_paged_attn_last_family(0), oomb_cuda_paged_attn_last_family(1), e_dq, e_dkc, e_dvc, e_dkp, e_dvp);
    fflush(stdout);
    oomb_free(dc);
    oomb_free(hc);
}

#endif // OOMB_USE_CUDA

} // namespace

// accumulate = 1 on every family: wgmma (where the device has it) and mma.sync (config.wgmma = 0)
// for bf16 pools of head dim 128 / 64, the generic kernels for f32 pools of head dim 40; dense and
// page lists; chunks of 37 / 200 tokens starting mid-page after 1,000-3,000 positions.
TEST(CudaPagedAttn, AccumulatedBlocksMatchCpu) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    uint32_t seed = 9191;
    // wgmma 3 with both ways of adding dQ (config.bwd_dqacc: the accumulator is added onto the dq of
    // the earlier block), then the mma.sync kernels
    for (int v : {0, 1, 2}) {
        const int w = v == 2 ? 0 : 3;
        const bool dqacc = v == 1;
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.wgmma = w; cf.bwd_dqacc = dqacc; });
        for (oomb_page_schedule_kind k : {OOMB_SCHEDULE_DENSE, OOMB_SCHEDULE_LISTS}) {
            const Case cases[] = {
                {128, 128, 28, 4, 200, 3000, B, 0, false, k},
                {64, 64, 14, 2, 37, 1000, B, 0, false, k},
                {40, 48, 6, 2, 37, 1000, OOMB_TYPE_F32, 0, false, k},
            };
            for (const Case & c : cases) run_accum_case(c, seed++);
        }
    }
#endif
}

// bf16 pools: the tensor-core kernels
TEST(CudaPagedAttn, Bf16Pools) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    const Case cases[] = {
        {128, 128, 28, 4, 256, 5000, B, 1, false},
        {128, 64, 28, 4, 37, 1000, B, 0, false},
        {128, 128, 14, 2, 1, 5000, B, 1, false},
        {128, 64, 4, 4, 256, 0, B, 1, false},
        {128, 128, 4, 4, 37, 5000, B, 0, false},
        {128, 64, 14, 2, 256, 1000, B, 1, true},
        {128, 128, 28, 4, 1, 0, B, 1, false},
        {64, 128, 28, 4, 37, 0, B, 1, false},
        {64, 64, 14, 2, 256, 1000, B, 0, false},
        {64, 128, 4, 4, 1, 1000, B, 1, false},
        {64, 64, 28, 4, 256, 5000, B, 1, false},
        {64, 128, 14, 2, 1, 0, B, 0, false},
        {64, 64, 4, 4, 37, 5000, B, 1, true},
    };
    uint32_t seed = 1234;
    for (const Case & c : cases) run_case(c, seed++);
#endif
}

// A zero or negative attention scale (legal: oomb_paged_attn takes any): the wgmma forwards, whose softmax
// takes the row max over the raw products (exact for a positive scale only), hand it to the mma.sync
// kernels (the family check), the backward stays on wgmma; both against the CPU.
TEST(CudaPagedAttn, Bf16PoolsNonPositiveScale) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    Case cases[] = {
        {128, 128, 28, 4, 37, 1000, B, 1, false},
        {64, 128, 14, 2, 256, 300, B, 0, false},
        {128, 128, 4, 4, 1, 5000, B, 1, false},
        {128, 128, 28, 4, 256, 5000, B, 1, false, OOMB_SCHEDULE_LISTS},
        {64, 128, 14, 2, 37, 3000, B, 0, false, OOMB_SCHEDULE_RANGE},
        {128, 128, 28, 4, 256, 9000, B, 1, false},  // (a long history: the wgmma forward would split its keys)
    };
    const float muls[] = {-1.0f, -0.5f, 0.0f, -1.0f, 0.0f, -0.25f};
    uint32_t seed = 777;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cases[i].scale_mul = muls[i];
        run_case(cases[i], seed++);
        EXPECT_EQ(oomb_cuda_paged_attn_last_fwd_split(), 1) << case_name(cases[i]) << ": the mma.sync forward does not split its keys";
    }
#endif
}

// The backward's split of a key tile's row tiles over several blocks (dK/dV added with atomics):
// forced to 1 (one block owns each key tile: plain adds) and 3 (uneven deal), on a few shapes with
// history and GQA. (The automatic choice keeps >= ~7,168 group rows per block, so the default runs
// above are not split: only forcing covers it.)
TEST(CudaPagedAttn, Bf16PoolsBackwardSplit) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    const Case cases[] = {
        {128, 128, 28, 4, 256, 5000, B, 1, false},
        {64, 64, 14, 2, 256, 1000, B, 0, false},
        {128, 64, 14, 2, 37, 1000, B, 1, true},
    };
    for (int ns : {1, 3}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.split = ns; });
        SCOPED_TRACE("split " + std::to_string(ns));
        printf("[ split ] config.split = %d\n", ns);
        uint32_t seed = 4321;
        for (const Case & c : cases) run_case(c, seed++);
    }
#endif
}

// Splits over the keys. The warp-specialised forward's key shares (config.fwd_split 2-4 forced; each
// share >= 8 key tiles, else the block's last share takes all; partial results merged by their LSEs):
// histories of 5000 (40 key tiles: every share count splits, unevenly) and 2200 / 1100 positions (18 / 9
// tiles: some counts split, some leave the tile to one share), NaN in the pool tails, GQA 7 / 3 / 2,
// page ranges from the history's middle (21 pages: shares of a shifted page table), and accumulated
// blocks (the last share merges into the earlier block's result, the others into it after).
TEST(CudaPagedAttn, Bf16PoolsKeySplit) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    const Case cases[] = {
        {128, 128, 28, 4, 256, 5000, B, 1, false},
        {64, 128, 14, 2, 37, 5000, B, 0, true},
        {128, 128, 14, 2, 1, 5000, B, 1, false},
        {64, 128, 9, 3, 45, 1100, B, 1, false},
        {64, 128, 9, 3, 45, 5000, B, 1, false},  // H T odd: each share's partial stride padded (float2 stores)
        {128, 128, 8, 4, 45, 2200, B, 1, false},
        {128, 128, 14, 2, 37, 2200, B, 1, false, OOMB_SCHEDULE_DENSE, -1, 0, -1, true},
        {64, 128, 14, 2, 37, 5000, B, 1, false, OOMB_SCHEDULE_DENSE, -1, 0, -1, true},
        {128, 128, 28, 4, 256, 5000, B, 1, false, OOMB_SCHEDULE_RANGE},
        {64, 128, 14, 2, 37, 5000, B, 0, true, OOMB_SCHEDULE_RANGE},
        {128, 128, 7, 1, 33, 9000, B, 1, false, OOMB_SCHEDULE_RANGE},
    };
    uint32_t seed = 5151;
    // the shares launched: fs on the warp-specialised forward (a wgmma build on Hopper, not turned off
    // by the environment's OOMB_PAGED_ATTN_* settings), else 1. Whether a block's keys are long enough
    // to split is the kernel's choice (>= 8 key tiles a share): the 5,000- and 9,000-position histories
    // split at every share count, 1,100 at none, 2,200 at 2.
    auto check = [&](const Case & c, uint32_t sd, bool acc, int fs) {
        g_fwd_split_max = 0;
        const bool ws = expected_family(c, 0) == "wgmma" && oomb_cuda_paged_attn_config().fwd_ws != 0;
        if (acc) run_accum_case(c, sd);
        else run_case(c, sd);
        if (HasFatalFailure()) return;
        EXPECT_EQ(g_fwd_split_max, ws ? fs : 1) << "key shares the forward launched";
    };
    for (int fs : {2, 3, 4}) {
        // head dim 64 with two consumer warpgroups (three are never split)
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_split = fs, cf.fwd_wg3 = 0; });
        SCOPED_TRACE("fwd_split " + std::to_string(fs));
        printf("[ kernels ] config.fwd_split = %d\n", fs);
        for (const Case & c : cases) check(c, seed++, false, fs);
        const Case acc[] = {
            {128, 128, 28, 4, 200, 5000, B, 0, false},
            {64, 128, 14, 2, 37, 3000, B, 0, false},
            {128, 128, 28, 4, 200, 9000, B, 0, false},
            {64, 128, 14, 2, 37, 9000, B, 0, false},
        };
        for (const Case & c : acc) check(c, seed++, true, fs);
    }
    // the other warp-specialised variants (no intra-warpgroup overlap; two K/V stages) split too
    for (int ws : {2, 3}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_split = 3, cf.fwd_ws = ws, cf.fwd_wg3 = 0; });
        SCOPED_TRACE("fwd_ws " + std::to_string(ws) + ", fwd_split 3");
        printf("[ kernels ] config.fwd_ws = %d, fwd_split = 3\n", ws);
        for (int i : {0, 1, 4, 8}) check(cases[i], seed++, false, 3);
    }
    // off: no shares
    {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_split = 1, cf.fwd_wg3 = 0; });
        check(cases[0], seed++, false, 1);
    }
#endif
}

// The OOMB_PAGED_ATTN_* overrides (host code: runs without a GPU too), strictly parsed where they were.
TEST(CudaPagedAttn, ConfigFromEnv) {
#ifdef OOMB_USE_CUDA
    // the caller's OOMB_PAGED_ATTN_* settings: unset here (the defaults are checked), restored after
    struct EnvScope {
        std::vector<std::pair<std::string, std::string>> saved;
        EnvScope() {
            for (char ** e = environ; *e; e++) {
                const std::string kv = *e;
                const size_t eq = kv.find('=');
                if (kv.rfind("OOMB_PAGED_ATTN_", 0) == 0 && eq != std::string::npos) saved.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
            }
            for (const auto & kv : saved) unsetenv(kv.first.c_str());
        }
        ~EnvScope() {
            for (const auto & kv : saved) setenv(kv.first.c_str(), kv.second.c_str(), 1);
        }
    } env_scope;
    setenv("OOMB_PAGED_ATTN_WGMMA", "abc", 1);
    EXPECT_OOMB_ERROR(oomb_paged_attn_config_from_env(), "OOMB_PAGED_ATTN_WGMMA must be 0-3");
    setenv("OOMB_PAGED_ATTN_WGMMA", "1", 1);
    setenv("OOMB_PAGED_ATTN_SPLIT", "3", 1);
    setenv("OOMB_PAGED_ATTN_FWDPIPE", "2", 1);
    EXPECT_OOMB_ERROR(oomb_paged_attn_config_from_env(), "OOMB_PAGED_ATTN_FWDPIPE must be 0 or 1");
    unsetenv("OOMB_PAGED_ATTN_FWDPIPE");
    // OOMB_PAGED_ATTN_<name> = bad: an error naming the range; = v: read as v; unset: the default
    using Get = int (*)(const oomb_paged_attn_config &);
    auto digit_var = [](const char * name, const char * bad, const char * range, int v, int def, Get get, const char * why) {
        const std::string var = std::string("OOMB_PAGED_ATTN_") + name;
        setenv(var.c_str(), bad, 1);
        EXPECT_OOMB_ERROR(oomb_paged_attn_config_from_env(), var + " must be " + range);
        setenv(var.c_str(), std::to_string(v).c_str(), 1);
        EXPECT_EQ(get(oomb_paged_attn_config_from_env()), v) << var;
        unsetenv(var.c_str());
        EXPECT_EQ(get(oomb_paged_attn_config_from_env()), def) << var << ": " << why;
    };
    digit_var("BWDPIPE", "2", "0 or 1", 0, 1, [](const oomb_paged_attn_config & c) { return (int) c.bwd_pipe; },
              "the row-tile-overlapped backward is the default");
    digit_var("FWDWG3", "3", "0-2", 0, 2, [](const oomb_paged_attn_config & c) { return c.fwd_wg3; }, "chosen per call by default");
    digit_var("BWDKVR", "2", "0 or 1", 0, 1, [](const oomb_paged_attn_config & c) { return (int) c.bwd_kvr; }, "K / V in registers by default");
    digit_var("BWDDQACC", "2", "0 or 1", 0, 1, [](const oomb_paged_attn_config & c) { return (int) c.bwd_dqacc; },
              "dQ into the tile-contiguous accumulator by default");
    digit_var("FWDWS", "4", "0-3", 0, 1, [](const oomb_paged_attn_config & c) { return c.fwd_ws; }, "the warp-specialised forward is the default");
    for (const char * bad : {"16", "x", "-1", "1x"})
        digit_var("LISTSBWD", bad, "0-15", 9, 13, [](const oomb_paged_attn_config & c) { return c.lists_bwd; },
                  "page lists: order, query-tile masks and unmasked single-tile rows by default");
    EXPECT_EQ(oomb_paged_attn_config_from_env().fwd_split, -1) << "the forward's key split is chosen per call by default";
    setenv("OOMB_PAGED_ATTN_FWDSPLIT", "2", 1);
    {
        const oomb_paged_attn_config e = oomb_paged_attn_config_from_env();
        EXPECT_EQ(e.wgmma, 1);
        EXPECT_EQ(e.split, 3);
        EXPECT_EQ(e.occ64, 1);
        EXPECT_EQ(e.fwd_split, 2);
    }
    unsetenv("OOMB_PAGED_ATTN_FWDSPLIT");
    unsetenv("OOMB_PAGED_ATTN_WGMMA");
    unsetenv("OOMB_PAGED_ATTN_SPLIT");
#endif
}

// At head dims 64 and 128 the forward (page size a multiple of 128) and the backward run the wgmma kernels
// on an sm_90a build on Hopper (the default above). OOMB_PAGED_ATTN_WGMMA selects them (bit 0
// forward, bit 1 backward): 0 (the mma.sync kernels, also with the backward split forced to 1 and
// 3), 1 and 2 (one of each: the statistics of one kernel feed the other's backward).
TEST(CudaPagedAttn, Bf16PoolsKernelChoice) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    {
        // an sm_90a build (the CMake default) on a compute capability 9.0 GPU must run the wgmma
        // kernels, or this test would only compare the mma.sync kernels with themselves
        int dev = 0, major = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
#ifdef OOMB_TEST_CUDA_ARCHS
        const bool built_90a = std::string(OOMB_TEST_CUDA_ARCHS).find("90a") != std::string::npos;
#else
        const bool built_90a = false;
#endif
        const bool fwd = oomb_cuda_paged_attn_uses_wgmma(128, 128, 0), bwd = oomb_cuda_paged_attn_uses_wgmma(64, 64, 1);
        printf("[ kernels ] compute capability %d.x, build archs %s: wgmma forward %s, backward %s\n", major,
#ifdef OOMB_TEST_CUDA_ARCHS
               OOMB_TEST_CUDA_ARCHS,
#else
               "?",
#endif
               fwd ? "yes" : "no", bwd ? "yes" : "no");
        if (major == 9 && built_90a) {
            EXPECT_TRUE(fwd && bwd) << "sm_90a build on a Hopper GPU: the wgmma kernels should run";
            EXPECT_FALSE(oomb_cuda_paged_attn_uses_wgmma(128, 64, 0)) << "forward: page 64 is not a multiple of 128";
            EXPECT_FALSE(oomb_cuda_paged_attn_uses_wgmma(96, 128, 1)) << "head dim 96";
        }
        {
            ConfigScope cs([](oomb_paged_attn_config & cf) { cf.wgmma = 2; });
            EXPECT_FALSE(oomb_cuda_paged_attn_uses_wgmma(128, 128, 0));
            EXPECT_EQ(oomb_cuda_paged_attn_uses_wgmma(128, 128, 1), major == 9 && built_90a);
        }
    }
    const oomb_type B = OOMB_TYPE_BF16;
    const Case cases[] = {
        {128, 128, 28, 4, 256, 5000, B, 1, false},
        {128, 64, 28, 4, 37, 1000, B, 0, false},
        {128, 128, 14, 2, 1, 5000, B, 1, false},
        {128, 128, 14, 2, 256, 1000, B, 1, true},
        {64, 128, 14, 2, 256, 1000, B, 1, true},
        {64, 64, 28, 4, 37, 5000, B, 0, false},
        {64, 128, 4, 4, 1, 1000, B, 1, false},
        // short histories: the causal mask inside the first key tiles; hist 118 with 7 heads per
        // KV head: a block's first warpgroup needs one key tile, its second two; 1100 + 37: an odd
        // number of key tiles
        {128, 128, 28, 4, 256, 0, B, 1, false},
        {64, 128, 14, 2, 256, 0, B, 1, false},
        {128, 128, 14, 2, 37, 118, B, 1, false},
        {64, 128, 14, 2, 37, 118, B, 1, false},
        {64, 128, 14, 2, 37, 1100, B, 1, false},
        {64, 128, 14, 2, 5, 0, B, 1, false},
        // GQA groups of 3 (SmolLM2: 9 / 3 heads, head dim 64) and 2: row tiles that split a position's
        // heads (rows t G + h), in the kernels and in the dQ accumulator's conversion
        {64, 128, 9, 3, 37, 1100, B, 1, false},
        {128, 128, 8, 4, 45, 300, B, 1, false},
        // NaN in the pool slots past the last position and in the spare pages: the last key tile's
        // tail must weigh nothing (the warp-specialised forward zeroes it in shared memory)
        {128, 128, 14, 2, 37, 1100, B, 1, false, OOMB_SCHEDULE_DENSE, -1, 0, -1, true},
        {64, 128, 14, 2, 37, 1100, B, 1, false, OOMB_SCHEDULE_DENSE, -1, 0, -1, true},
        {128, 128, 28, 4, 256, 0, B, 1, true, OOMB_SCHEDULE_DENSE, -1, 0, -1, true},
    };
    uint32_t seed = 777;
    const int settings[][2] = {{0, -1}, {0, 1}, {0, 3}, {1, -1}, {2, -1}};  // wgmma bits, split
    for (const auto & st : settings) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.wgmma = st[0]; cf.split = st[1]; });
        SCOPED_TRACE("wgmma " + std::to_string(st[0]) + " split " + std::to_string(st[1]));
        printf("[ kernels ] config.wgmma = %d, config.split = %d\n", st[0], st[1]);
        for (const Case & c : cases) run_case(c, seed++);
    }
    // the wgmma forward: the warp-specialised kernel without the intra-warpgroup overlap (2), with 2
    // K/V stages (3), and the two-warpgroup kernel (0; the default 1, with the overlap, ran above)
    for (int ws : {3, 2, 0}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_ws = ws; cf.wgmma = 1; });
        printf("[ kernels ] config.fwd_ws = %d, config.wgmma = 1\n", ws);
        for (const Case & c : cases) run_case(c, seed++);
    }
    {
        // head dim 64: the wgmma forward with the next tile's S overlapping the softmax (fwd_pipe)
        ConfigScope cs([](oomb_paged_attn_config & cf) { cf.fwd_pipe = true; });
        printf("[ kernels ] config.fwd_pipe = 1\n");
        for (const Case & c : cases)
            if (c.D == 64) run_case(c, seed++);
    }
    // the wgmma backward's other kernel (config.bwd_pipe: the row tiles overlapped, or one at a
    // time), with the automatic split and with three blocks per key tile (f32 atomics, blocks that
    // get no row tile)
    for (int sp : {-1, 3}) {
        const bool pipe = !oomb_paged_attn_config{}.bwd_pipe;
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.bwd_pipe = pipe; cf.split = sp; });
        printf("[ kernels ] config.bwd_pipe = %d, config.split = %d\n", (int) pipe, sp);
        for (const Case & c : cases) run_case(c, seed++);
    }
    // the pipelined backward's other way of adding dQ (config.bwd_dqacc: atomics into a tile-contiguous
    // accumulator, or into dq's rows), with the automatic split and with three blocks per key tile
    for (int sp : {-1, 3}) {
        const bool dqacc = !oomb_paged_attn_config_from_env().bwd_dqacc;  // (ConfigScope starts from the environment)
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.bwd_dqacc = dqacc; cf.split = sp; });
        printf("[ kernels ] config.bwd_dqacc = %d, config.split = %d\n", (int) dqacc, sp);
        for (const Case & c : cases) run_case(c, seed++);
    }
    // head dim 64: the forward's three consumer warpgroups forced (config.fwd_wg3 1; the automatic
    // choice picks two at these sizes: too few rows to fill the SMs' waves) and the other setting of
    // the backward's K / V in registers
    // (config.bwd_kvr), with the automatic split and with three blocks per key tile
    for (int sp : {-1, 3}) {
        const oomb_paged_attn_config def{};
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_wg3 = 1; cf.bwd_kvr = !def.bwd_kvr; cf.split = sp; });
        printf("[ kernels ] config.fwd_wg3 = 1, config.bwd_kvr = %d, config.split = %d\n", (int) !def.bwd_kvr, sp);
        for (const Case & c : cases)
            if (c.D == 64) run_case(c, seed++);
    }
    // head dim 64: the wgmma kernels with one / two CTAs per SM (config.occ64; default 1, the
    // forward with two; the backward's bit 1 applies to pa_bwd_wgmma_kernel, config.bwd_pipe off)
    for (int occ : {0, 2, 3}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.occ64 = occ; cf.bwd_pipe = false; });
        printf("[ kernels ] config.occ64 = %d\n", occ);
        for (const Case & c : cases)
            if (c.D == 64) run_case(c, seed++);
    }
#endif
}

// The attention-result cache on the GPU (oomb_paged_attn_cached): f32 and bf16 caches, the generic
// kernels with an odd D*H (the bf16 cache's LSE part is then only 2-byte aligned) and the
// tensor-core kernels at head dim 128.
TEST(CudaPagedAttn, ResultCache) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    uint32_t seed = 99;
    for (oomb_type ct : {OOMB_TYPE_BF16, OOMB_TYPE_F32}) {
        run_cache_case(7, 3, 1, 2, 1, 4, OOMB_TYPE_F32, ct, seed++);
        run_cache_case(5, 3, 3, 3, 0, 8, OOMB_TYPE_F32, ct, seed++);
        run_cache_case(128, 28, 4, 37, 130, 128, OOMB_TYPE_BF16, ct, seed++);
        run_cache_case(64, 14, 2, 1, 255, 64, OOMB_TYPE_BF16, ct, seed++);
    }
#endif
}

// f32 (and f16) pools, and shapes the tensor-core kernels do not take: the generic f32 kernels
TEST(CudaPagedAttn, GenericPools) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const Case cases[] = {
        {128, 128, 28, 4, 37, 1000, OOMB_TYPE_F32, 1, false},
        {64, 64, 14, 2, 256, 0, OOMB_TYPE_F32, 1, true},
        {128, 64, 4, 4, 1, 5000, OOMB_TYPE_F32, 0, false},
        {64, 128, 28, 4, 256, 1000, OOMB_TYPE_F32, 0, false},
        {128, 128, 14, 2, 37, 1000, OOMB_TYPE_F16, 1, false},
        {96, 32, 4, 2, 37, 100, OOMB_TYPE_BF16, 1, false}, // head dim without a tensor-core kernel
    };
    uint32_t seed = 777;
    for (const Case & c : cases) run_case(c, seed++);
#endif
}

// Page schedules (page range, page lists) against the CPU reference kernels with the same schedule:
// bf16 pools at the wgmma / mma.sync sizes (head dims 64 and 128, pages 64 and 128, histories that
// do not fill the last page, chunks starting mid-page) and f32 / f16 pools; every case also checks
// the family the dispatcher ran. Page ranges also on the mma.sync kernels (config.wgmma = 0), with a
// range starting after the chunk's first rows (rows without keys: out 0, LSE -inf) and an empty one.
TEST(CudaPagedAttn, Schedules) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    uint32_t seed = 2468;
    for (oomb_page_schedule_kind k : {OOMB_SCHEDULE_RANGE, OOMB_SCHEDULE_LISTS, OOMB_SCHEDULE_LISTS_RANGE}) {
        const Case cases[] = {
            {128, 128, 28, 4, 256, 1000, B, 1, false, k},
            {128, 128, 14, 2, 37, 5000, B, 0, false, k},
            {64, 128, 14, 2, 256, 1000, B, 1, false, k},
            {64, 64, 28, 4, 37, 1100, B, 0, false, k},
            {128, 64, 4, 4, 1, 700, B, 1, false, k},
            {64, 128, 14, 2, 5, 300, B, 1, false, k},
            {128, 128, 28, 4, 37, 1000, OOMB_TYPE_F32, 1, false, k},
            {64, 64, 14, 2, 200, 333, OOMB_TYPE_F16, 0, false, k},
            {96, 32, 6, 2, 37, 100, B, 1, false, k},
        };
        for (const Case & c : cases) run_case(c, seed++);
        if (k == OOMB_SCHEDULE_RANGE) {
            ConfigScope cs([](oomb_paged_attn_config & cf) { cf.wgmma = 0; });
            printf("[ kernels ] page ranges, config.wgmma = 0\n");
            for (const Case & c : cases) run_case(c, seed++);
        }
        if (k == OOMB_SCHEDULE_RANGE) {
            // head dim 64: the forward's three consumer warpgroups forced (page ranges are dense rows)
            ConfigScope cs([](oomb_paged_attn_config & cf) { cf.fwd_wg3 = 1; });
            printf("[ kernels ] page ranges, config.fwd_wg3 = 1\n");
            for (const Case & c : cases)
                if (c.D == 64) run_case(c, seed++);
        }
    }
    // ranges where some rows (or all) see no key: compared as the CPU (out 0, LSE -inf, no gradient)
    for (int w : {3, 0}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.wgmma = w; });
        const Case cases[] = {
            {128, 128, 28, 4, 256, 1000, B, 1, false, OOMB_SCHEDULE_RANGE},
            {64, 64, 14, 2, 37, 1100, B, 0, false, OOMB_SCHEDULE_RANGE},
            {64, 128, 14, 2, 300, 0, OOMB_TYPE_F32, 1, false, OOMB_SCHEDULE_RANGE},
        };
        for (const Case & c : cases) {
            for (int f : {c.hist / c.P + 1, 1 << 20}) {  // after the chunk's first page; beyond every page (empty)
                Case cc = c;
                cc.range_first = f;
                run_case(cc, seed++);
            }
        }
    }
#endif
}

// Page lists on the tensor-core kernels (issue 13), each family forced: the wgmma kernels (where
// the device has them: forward for pages multiple of 128, backward for all) and the mma.sync ones
// (config.wgmma = 0). bf16 pools, head dims 64 and 128, GQA groups 7, 3, 2, 1 and 8, pages 128, 64
// and 192 (the wgmma backward with the mma.sync forward), chunks that are not a multiple of the
// page and start mid-page (a forward block's rows then span two or more query tiles: the union of
// their lists), sparse lists with gaps, empty lists, pages chosen by several tiles; and a page of
// 48, which the fast kernels do not take (the generic ones, checked by the family). Every case
// prints its errors; a failure names the worst element (row, head, dim) and the family that ran.
TEST(CudaPagedAttn, ListsFastKernels) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    const oomb_page_schedule_kind L = OOMB_SCHEDULE_LISTS;
    // head dims 128 / 64 x pages 128 / 64 x GQA 7, 3, 2, 1, 8 (at G 1 a forward block's 128 rows
    // span two or three query tiles), chunks of 150 + 37 k tokens after 700 + 300 k positions (not
    // page multiples), the three list kinds in turn
    std::vector<Case> cases;
    const int gqa[][2] = {{28, 4}, {6, 2}, {4, 2}, {8, 8}, {16, 2}};
    for (int D : {128, 64})
        for (int P : {128, 64})
            for (int k = 0; k < 5; k++)
                cases.push_back({D, P, gqa[k][0], gqa[k][1], 150 + 37 * k, 700 + 300 * k, B, k & 1, false, L, -1, (k + D / 64 + P / 64) % 3});
    cases.push_back({128, 128, 14, 2, 37, 5000, B, 0, false, L, -1, 1});   // a long history, a short chunk
    cases.push_back({128, 192, 8, 4, 100, 900, B, 1, false, L, -1, 1});    // page 192: mma.sync forward, wgmma backward
    cases.push_back({64, 128, 7, 7, 1, 3000, B, 1, false, L, -1, 1});      // one query
    cases.push_back({128, 48, 14, 2, 100, 500, B, 1, false, L, -1, 1});    // page 48: the generic kernels
    // page-aligned chunks (every row tile in one query tile: the backward's and forward's unmasked history
    // tiles, config.lists_bwd bit 3, and the skipped query-tile masks), G 7 and G 1; pages 256 and 192 (c0 3:
    // a 128-key tile holding the last history keys and the first current ones)
    cases.push_back({128, 128, 28, 4, 300, 1024, B, 0, false, L, -1, 1});
    cases.push_back({64, 128, 8, 8, 256, 1280, B, 1, false, L, -1, 0});
    cases.push_back({128, 256, 28, 4, 300, 1100, B, 1, false, L, -1, 1});
    cases.push_back({128, 192, 8, 4, 200, 626, B, 0, false, L, -1, 1});
    uint32_t seed = 1313;
    for (int w : {3, 0}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.wgmma = w; });
        printf("[ kernels ] page lists, config.wgmma = %d\n", w);
        for (const Case & c : cases) run_case(c, seed++);
    }
    {
        // the backward's row tiles dealt to several blocks per key tile (f32 gradient pages: atomics)
        ConfigScope cs([](oomb_paged_attn_config & cf) { cf.split = 3; });
        printf("[ kernels ] page lists, config.split = 3\n");
        for (int i = 0; i < 3; i++) run_case(cases[i], seed++);
    }
    // the wgmma forward's other variants on page lists (the default above: warp-specialised with
    // the overlap, 1): the two-warpgroup kernel, warp-specialised without the overlap (2, 3)
    for (int ws : {0, 2, 3}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_ws = ws; cf.wgmma = 1; });
        printf("[ kernels ] page lists, config.fwd_ws = %d\n", ws);
        for (const Case & c : cases) run_case(c, seed++);
    }
    for (int sp : {-1, 3}) {
        // the wgmma backward's other kernel (config.bwd_pipe)
        const bool pipe = !oomb_paged_attn_config{}.bwd_pipe;
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.bwd_pipe = pipe; cf.split = sp; });
        printf("[ kernels ] page lists, config.bwd_pipe = %d, config.split = %d\n", (int) pipe, sp);
        for (const Case & c : cases) run_case(c, seed++);
    }
    {
        // the pipelined backward's other way of adding dQ (config.bwd_dqacc)
        const bool dqacc = !oomb_paged_attn_config_from_env().bwd_dqacc;  // (ConfigScope starts from the environment)
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.bwd_dqacc = dqacc; });
        printf("[ kernels ] page lists, config.bwd_dqacc = %d\n", (int) dqacc);
        for (const Case & c : cases) run_case(c, seed++);
    }
    // the page-list backward's options (config.lists_bwd): each block order, history key tiles split or
    // always unsplit (lists_hist_fill 0) while the current region's tiles split 3 ways (atomics beside
    // read-add stores in one launch), the rows' page bits by search or from query-tile masks, on the
    // three backward kernels (pipelined wgmma, wgmma, mma.sync)
    for (int ord : {0, 3, 4, 8, 15})
        for (int fam : {0, 1, 2}) {
            ConfigScope cs([&](oomb_paged_attn_config & cf) {
                cf.lists_bwd = ord; cf.lists_hist_fill = 0; cf.split = 3;
                cf.wgmma = fam == 2 ? 1 : 3; cf.bwd_pipe = fam == 0;
            });
            printf("[ kernels ] page lists, config.lists_bwd = %d, split 3, backward %s\n", ord,
                   fam == 0 ? "wgmma pipelined" : fam == 1 ? "wgmma" : "mma.sync");
            for (const Case & c : cases) run_case(c, seed++);
        }
    {
        // more than 32 query tiles in a chunk (G 1, page 64: ~34 tiles): the query-tile masks' later words, each
        // backward kernel; and past 256 tiles (page 64, 300 x 64 = 19,200 tokens would be slow on the CPU: instead
        // the masks are off, bit 2 clear, for the same case: the per-row search)
        const Case big{64, 64, 8, 8, 2150, 1032, B, 0, false, L, -1, 1};
        for (int ord : {13, 9})
            for (int fam : {0, 2}) {
                ConfigScope cs([&](oomb_paged_attn_config & cf) {
                    cf.lists_bwd = ord; cf.wgmma = fam == 2 ? 1 : 3; cf.bwd_pipe = fam == 0;
                });
                printf("[ kernels ] page lists, %d query tiles, config.lists_bwd = %d, backward %s\n", (2150 + 63) / 64, ord,
                       fam == 0 ? "wgmma pipelined" : "mma.sync");
                run_case(big, seed++);
            }
    }
#endif
}

// LISTS_RANGE (the offload's blocks of a sparse history) on the tensor-core kernels, behind
// config.lists_range_fast (issue 13), each family forced as in ListsFastKernels, against the CPU
// reference: head dims 128 / 64, GQA groups 7, 2 and 1, pages 128 and 64, chunks that start
// mid-page; windows that cut the lists inside the history (no current region), that take the
// current region's first page only, that start inside the current region, that start on an odd
// page (page 64: a 128-key backward tile straddles the window's edge), the whole current region
// from the history's middle, and empty windows (first == last; beyond every page). Rows that see
// no key: out 0, LSE -inf, no gradient, as the CPU. A failure names the worst element and family.
TEST(CudaPagedAttn, ListsRangeFastKernels) {
    SKIP_WITHOUT_GPU();
#ifdef OOMB_USE_CUDA
    const oomb_type B = OOMB_TYPE_BF16;
    // the gate of the LISTS_RANGE routing (on by default): the environment variable, strictly parsed
    EXPECT_TRUE(oomb_paged_attn_config{}.lists_range_fast) << "LISTS_RANGE on the fast kernels is on by default";
    setenv("OOMB_PAGED_ATTN_LISTS_RANGE_FAST", "0", 1);
    EXPECT_FALSE(oomb_paged_attn_config_from_env().lists_range_fast);
    setenv("OOMB_PAGED_ATTN_LISTS_RANGE_FAST", "1", 1);
    EXPECT_TRUE(oomb_paged_attn_config_from_env().lists_range_fast);
    setenv("OOMB_PAGED_ATTN_LISTS_RANGE_FAST", "yes", 1);
    EXPECT_OOMB_ERROR(oomb_paged_attn_config_from_env(), "OOMB_PAGED_ATTN_LISTS_RANGE_FAST must be 0 or 1");
    unsetenv("OOMB_PAGED_ATTN_LISTS_RANGE_FAST");
    const oomb_page_schedule_kind LR = OOMB_SCHEDULE_LISTS_RANGE;
    std::vector<Case> cases;
    const int gqa[][2] = {{28, 4}, {4, 2}, {8, 8}};  // G 7, 2, 1
    for (int D : {128, 64})
        for (int P : {128, 64})
            for (int k = 0; k < 3; k++) {
                const int hist = 700 + 300 * k + P / 2 + 5, T = 150 + 37 * k;  // the chunk starts mid-page
                const int c0 = hist / P, c_end = (hist + T - 1) / P + 1;
                const int mode = (k + D / 64 + P / 64) % 2;  // lists: tile 0 every page / sparse with gaps
                const int wins[][2] = {
                    {c0 / 4, c0 - c0 / 3},     // cuts the lists, no current region
                    {(c0 / 2) | 1, c0 + 1},    // history from an odd page and the current region's first page only
                    {c0 + 1, c_end},           // inside the current region, from its second page
                    {3, 3},                    // empty
                    {c0 / 2, c_end},           // the history's second half and the whole current region
                };
                for (const auto & w : wins) {
                    Case c{D, P, gqa[k][0], gqa[k][1], T, hist, B, k & 1, false, LR, w[0], mode};
                    c.range_last = w[1];
                    cases.push_back(c);
                }
            }
    cases.push_back({128, 128, 14, 2, 37, 5000, B, 0, false, LR, 1 << 20, 1});  // beyond every page (empty)
    cases.push_back({64, 128, 7, 7, 1, 3000, B, 1, false, LR, 5, 1});            // one query, a window from page 5 through its page
    cases.push_back({128, 64, 14, 2, 100, 500, B, 1, false, LR, 2, 2});          // empty lists: the current region only
    cases.push_back({128, 192, 8, 4, 100, 900, B, 1, false, LR, 1, 1});          // page 192: mma.sync forward, wgmma backward
    cases.push_back({128, 48, 14, 2, 100, 500, B, 1, false, LR, 3, 1});          // page 48: the generic kernels, switch on
    uint32_t seed = 4242;
    for (int w : {3, 0}) {
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.wgmma = w; cf.lists_range_fast = true; });
        printf("[ kernels ] page lists in a window, config.lists_range_fast = 1, config.wgmma = %d\n", w);
        for (const Case & c : cases) run_case(c, seed++);
    }
    {
        // the backward's row tiles dealt to several blocks per key tile (f32 gradient pages: atomics)
        ConfigScope cs([](oomb_paged_attn_config & cf) { cf.split = 3; cf.lists_range_fast = true; });
        printf("[ kernels ] page lists in a window, config.split = 3\n");
        for (int i = 0; i < 5; i++) run_case(cases[i], seed++);
    }
    for (int ord : {0, 1, 2, 4, 8, 15}) {
        // the backward's blocks (config.lists_bwd): each order, history tiles split or always unsplit, row bits
        ConfigScope cs([&](oomb_paged_attn_config & cf) {
            cf.lists_bwd = ord; cf.lists_hist_fill = 0; cf.split = 3; cf.lists_range_fast = true;
        });
        printf("[ kernels ] page lists in a window, config.lists_bwd = %d, split 3\n", ord);
        for (const Case & c : cases) run_case(c, seed++);
    }
    for (int ws : {0, 3}) {
        // the two-warpgroup wgmma forward, the warp-specialised one with 2 stages and without the
        // overlap (the default above: warp-specialised with the overlap, 1)
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.fwd_ws = ws; cf.wgmma = 1; cf.lists_range_fast = true; });
        printf("[ kernels ] page lists in a window, config.fwd_ws = %d\n", ws);
        for (const Case & c : cases) run_case(c, seed++);
    }
    {
        // the wgmma backward's other kernel (config.bwd_pipe)
        const bool pipe = !oomb_paged_attn_config{}.bwd_pipe;
        ConfigScope cs([&](oomb_paged_attn_config & cf) { cf.bwd_pipe = pipe; cf.lists_range_fast = true; });
        printf("[ kernels ] page lists in a window, config.bwd_pipe = %d\n", (int) pipe);
        for (const Case & c : cases) run_case(c, seed++);
    }
    {
        // switch off (the default): the same schedule on the generic kernels (the family check)
        ConfigScope cs([](oomb_paged_attn_config & cf) { cf.lists_range_fast = false; });
        for (int i = 0; i < 2; i++) run_case(cases[i], seed++);
    }
#endif
}
