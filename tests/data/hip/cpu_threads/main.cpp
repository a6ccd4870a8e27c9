// Driver for a kernel source cut before its torch wrapper: reads the inputs' bytes, launches
// fp8_gemm_kernel as the wrapper would, writes C's bf16 bits.
//   main DIR m n k fnuz   (DIR holds a.bin [k][m], b.bin [k][n], as.bin [kb][m], bs.bin [kb][nb])
#include <cstdio>
#include <cstdlib>
#include <string>

static std::vector<char> slurp(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) { std::perror(path.c_str()); std::exit(2); }
    std::vector<char> data;
    char buf[1 << 16];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + got);
    std::fclose(f);
    return data;
}

int main(int argc, char** argv) {
    if (argc != 6) { std::fprintf(stderr, "usage: main DIR m n k fnuz\n"); return 2; }
    const std::string dir = argv[1];
    const int m = std::atoi(argv[2]), n = std::atoi(argv[3]), k = std::atoi(argv[4]);
    const int fnuz = std::atoi(argv[5]);
    const int nb = (n + 127) / 128;
    auto a = slurp(dir + "/a.bin"), b = slurp(dir + "/b.bin");
    auto as = slurp(dir + "/as.bin"), bs = slurp(dir + "/bs.bin");
    std::vector<uint16_t> c((size_t)m * n, 0xffff);
    dim3 grid((n + BLOCK_N - 1) / BLOCK_N, (m + BLOCK_M - 1) / BLOCK_M);
    // The task's layouts: a [m,k] column-major (lda = m), b likewise, a_scale [m,kb] with
    // strides (1, m), b_scale [nb,kb] with strides (1, nb), c row-major.
    ks_launch(grid, THREADS, fp8_gemm_kernel, (const uint8_t*)a.data(), (const uint8_t*)b.data(),
              (const float*)as.data(), (const float*)bs.data(), c.data(), m, n, k, (long)m,
              (long)n, 1L, (long)m, 1L, (long)nb, (long)n, int(m % 4 == 0), int(n % 4 == 0),
              fnuz);
    FILE* out = std::fopen((dir + "/c.bin").c_str(), "wb");
    std::fwrite(c.data(), 2, c.size(), out);
    std::fclose(out);
    return 0;
}
