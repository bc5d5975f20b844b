// The kernel pack's pieces: a Spec as text and back, a Spec re-sized, kernels named without N and K, the pack's
// structure list and grid, `comfuse pack`, and the list being what the families give (the Python test checks that).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "comfuse/codegen.h"
#include "comfuse/kernel_pack.h"
#include "comfuse/partition.h"
#include "comfuse/text.h"
#include "test_util.h"

using namespace comfuse;
using comfuse::test::fresh_dir;
using comfuse::test::run_cli;
namespace fs = std::filesystem;

namespace {

// Every region Spec of the examples (small and full size): bias, residuals, norms, softmax, rotary, two GEMMs on
// one A, row outputs.
std::vector<FusionSpec> example_specs() {
  std::vector<FusionSpec> out;
  for (const char* sub : {"examples", "examples/small"})
    for (const auto& e : fs::directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / sub)) {
      if (e.path().extension() != ".cf") continue;
      Graph g = parse_cf_file(e.path().string());
      if (g.symbolic()) continue;
      for (const Region& r : partition(g).regions) out.push_back(r.spec);
    }
  return out;
}

}  // namespace

TEST(KernelPack, SpecTextReadsBackExactly) {
  const auto specs = example_specs();
  ASSERT_GE(specs.size(), 15u);
  for (const FusionSpec& fs : specs) {
    const std::string text = spec_to_text(fs);
    const FusionSpec back = spec_from_text(text);
    EXPECT_EQ(spec_to_text(back), text);
    EXPECT_EQ(spec_structural_hash(back), spec_structural_hash(fs));
    EXPECT_EQ(spec_kernel_hash(back), spec_kernel_hash(fs));
    EXPECT_EQ(generate_kernel(back).source, generate_kernel(fs).source) << text;
  }
}

TEST(KernelPack, SpecTextErrorsNameTheLine) {
  const FusionSpec fs = example_specs().at(0);
  const std::string text = spec_to_text(fs);
  auto error_of = [](const std::string& t) {
    try {
      spec_from_text(t);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of("spec 3 0 1\n").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("spec 3 0 1\n").find("unknown format"), std::string::npos);
  std::string t = text;
  t.replace(t.find("gemm "), 5, "gemn ");
  EXPECT_NE(error_of(t).find("line 2"), std::string::npos) << error_of(t);
  EXPECT_NE(error_of(text.substr(0, text.size() / 2)).find("spec text, line"), std::string::npos);
  t = text;
  t.replace(t.find("node "), 6, "node 9");   // a kind out of range
  EXPECT_NE(error_of(t).find("out of range"), std::string::npos) << error_of(t);
  t = text;
  t.replace(t.find("stage "), 8, "stage 99");   // a terminal that is no node: verify_spec's
  EXPECT_NE(error_of(t).find("not a valid Spec"), std::string::npos) << error_of(t);
}

// One kernel serves a structure at every width: the name and the source leave out N and K (but not the head
// block of a periodic input), the problem's hash keeps them.
TEST(KernelPack, KernelsAreNamedWithoutNAndK) {
  for (const FusionSpec& fs : example_specs()) {
    FusionSpec wide;
    try {
      wide = spec_with_dims(fs, fs.gemm.n * 2, fs.gemm.k * 2);
    } catch (const std::invalid_argument&) {
      continue;
    }
    EXPECT_EQ(spec_kernel_hash(wide), spec_kernel_hash(fs));
    EXPECT_NE(spec_structural_hash(wide), spec_structural_hash(fs));
    KernelConfig cfg;   // one config for both (the planner may pick another per size)
    ASSERT_TRUE(parse_config("128x128x64_c1x1", cfg));
    if (psi_rejects(fs, cfg) || psi_rejects(wide, cfg)) continue;
    const GeneratedKernel a = generate_kernel(fs, cfg), b = generate_kernel(wide, cfg);
    EXPECT_EQ(a.name, b.name);
    if (fs.gemm.k <= 1024 && wide.gemm.k <= 1024) EXPECT_EQ(a.source, b.source);   // (K picks the tile-input form)
    EXPECT_EQ(a.source.find("N=" + std::to_string(fs.gemm.n)), std::string::npos);
  }
}

TEST(KernelPack, ResizedSpecsKeepTheirBlocks) {
  Graph g = parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/rope.cf");
  const FusionSpec fs = partition(g).regions.at(0).spec;
  const FusionSpec r = spec_with_dims(fs, 2048, 512);
  EXPECT_EQ(r.gemm.n, 2048);
  EXPECT_EQ(r.gemm.k, 512);
  for (const auto& o : r.outputs) EXPECT_EQ(o.shape.back(), o.per_row ? 1 : 2048);
  try {
    spec_with_dims(fs, 2048 + 32, 512);   // not a whole number of heads
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spec_with_dims(fs, 0, 512), std::invalid_argument);
}

TEST(KernelPack, StructureListAndGrid) {
  std::string list = "# a comment\n\n";
  const auto specs = example_specs();
  for (size_t i = 0; i < 3; ++i) list += "# structure " + std::to_string(i) + "\n" + spec_to_text(specs[i]) + "\n";
  const auto read = read_pack_structures(list, "list.txt");
  ASSERT_EQ(read.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(spec_to_text(read[i]), spec_to_text(specs[i]));
  try {
    read_pack_structures(list + spec_to_text(specs[0]).substr(0, 40), "list.txt");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("list.txt: the structure from line"), std::string::npos) << e.what();
  }
  PackGrid grid;
  grid.rows = {1024, 4096};
  grid.dims = {512, 1024};
  const auto problems = pack_problems(read, grid);
  // rows x (dims + own N) x (dims + own K), the own sizes counted once where a dim has them; none periodic
  EXPECT_LE(problems.size(), 3u * 2 * 3 * 3);
  EXPECT_GE(problems.size(), 3u * 2 * 2 * 2);
  std::set<std::string> sources = pack_sources(problems, CompilerOptions{});
  EXPECT_GE(sources.size(), 3u);
  EXPECT_LT(sources.size(), problems.size());   // one kernel serves several sizes
  // --own-sizes: each structure once, as written (a model's own kernels)
  grid.own_sizes_only = true;
  const auto own = pack_problems(read, grid);
  ASSERT_EQ(own.size(), read.size());
  for (size_t i = 0; i < own.size(); ++i) {
    EXPECT_EQ(own[i].structure, i);
    EXPECT_EQ(spec_to_text(own[i].spec), spec_to_text(read[i]));
  }
}

// The package's list is the one the CPU checks and the build compile: it parses, every structure has a fused
// kernel at its own size, and every example's own kernels that it covers are found by their source.
TEST(KernelPack, ThePackagesListReads) {
  const std::string path = std::string(COMFUSE_SOURCE_DIR) + "/kernels/pack/structures.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  const auto structures = read_pack_structures(text.str(), path);
  EXPECT_GE(structures.size(), 20u);
  for (size_t i = 0; i < structures.size(); ++i)
    EXPECT_TRUE(prior_source_hash(structures[i], CompilerOptions{}).has_value()) << "structure " << i;
  const auto problems = pack_problems(structures, PackGrid{});
  const auto sources = pack_sources(problems, CompilerOptions{});
  EXPECT_GE(sources.size(), structures.size());
  for (const FusionSpec& fs : structures)   // each at its own size is in the pack
    EXPECT_TRUE(sources.count(*prior_source_hash(fs, CompilerOptions{})));
}

TEST(KernelPack, CliDryRunCountsAndCoversAndRefusesBadArguments) {
  const fs::path d = fresh_dir("pack", "cli");
  std::ofstream(d / "list.txt") << spec_to_text(example_specs().at(0));
  auto r = run_cli("pack " + (d / "list.txt").string() + " --dry-run --rows 4096 --dims 1024,2048");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 structures, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dry run: nothing compiled"), std::string::npos) << r.out;
  r = run_cli("pack " + (d / "list.txt").string() + " --covers " + (d / "list.txt").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 of 1 kernels"), std::string::npos) << r.out;
  r = run_cli("pack " + (d / "list.txt").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("needs -o DIR"), std::string::npos) << r.out;
  r = run_cli("pack " + (d / "list.txt").string() + " --dry-run --dims 10x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--dims: '10x' is not a positive integer"), std::string::npos) << r.out;
  // a kernel that does not compile: an error, or with --keep-going (the package's build) left out, exit 0
  const std::string failing = "COMFUSE_NVCC=/bin/false COMFUSE_LOG=quiet COMFUSE_KERNEL_DIR=" +
                              std::string(COMFUSE_SOURCE_DIR) + "/kernels ";
  const std::string build = "pack " + (d / "list.txt").string() + " -o " + (d / "out").string() +
                            " --as-written --rows 4096 --dims 1024 --jobs 1";
  r = run_cli(build, failing);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("comfuse pack: failed: structure 0 at 4096x"), std::string::npos) << r.out;
  r = run_cli(build + " --keep-going", failing);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("left out of the pack (--keep-going)"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "out" / "pack.txt"));
  std::ofstream(d / "bad.txt") << "spec 1 0 1\ngemm 0 0 1\n";
  r = run_cli("pack " + (d / "bad.txt").string() + " --dry-run");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("bad.txt: the structure from line 1"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// Row parts (spec.h SpecOutput::row_parts, RuntimeParam::row_parts): written as format 2 and read back exactly, part
// of both hashes, and refused where they cannot be: an output that is not a row reduction's result the kernel only
// stores, a param that is not an f32 [rows, 1] input, a new width for an output whose count follows N.
TEST(KernelPack, RowPartsReadBackAndAreChecked) {
  const std::string dir = std::string(COMFUSE_SOURCE_DIR) + "/examples/";
  const FusionSpec stats = partition(parse_cf_file(dir + "prenorm_row_stats.cf")).regions.at(0).spec;
  const int o = row_reduction_output(stats);
  ASSERT_GE(o, 0) << print_spec(stats);
  const FusionSpec parted = spec_with_row_parts(stats, o, 8);
  const std::string text = spec_to_text(parted);
  EXPECT_EQ(text.rfind("spec 2 ", 0), 0u) << text;
  EXPECT_EQ(spec_to_text(stats).rfind("spec 1 ", 0), 0u) << "a Spec without row parts is written as before";
  EXPECT_EQ(spec_to_text(spec_from_text(text)), text);
  EXPECT_NE(spec_kernel_hash(parted), spec_kernel_hash(stats));
  EXPECT_NE(print_spec(parted).find("stored in row parts: [8, rows]"), std::string::npos) << print_spec(parted);
  const std::string src = generate_kernel(parted, KernelConfig{}).source;   // 128 x 128: 8 column blocks of 1024
  EXPECT_NE(src.find("ReduceToParts<"), std::string::npos) << src;
  EXPECT_NE(src.find("/*outputs*/ " + std::to_string(stats.outputs.size()) + ", /*params*/ " +
                     std::to_string(stats.params.size()) + ">;"),
            std::string::npos)
      << "no row-output workspace: " << src;
  KernelConfig wide;
  wide.tile_n = 256;
  EXPECT_THROW(generate_kernel(parted, wide), CodegenError) << "4 column blocks, not 8";
  EXPECT_THROW(spec_with_dims(parted, 2048, stats.gemm.k), std::invalid_argument);
  EXPECT_NO_THROW(spec_with_dims(parted, stats.gemm.n, 2 * stats.gemm.k));
  for (size_t i = 0; i < stats.outputs.size(); ++i)
    if (static_cast<int>(i) != o) EXPECT_THROW(spec_with_row_parts(stats, static_cast<int>(i), 8), std::invalid_argument);

  // a reader: the gate/up region of the Llama block with its RMSNorm finished in it reads mean(h^2) as [rows, 1]
  const Partition p = partition(defer_norms(parse_cf_file(dir + "llama_block.cf")));
  const FusionSpec& gate_up = p.regions.at(1).spec;
  int col = -1, other = -1;
  for (size_t i = 0; i < gate_up.params.size(); ++i)
    (gate_up.params[i].kind == BroadcastKind::Col ? col : other) = static_cast<int>(i);
  ASSERT_GE(col, 0) << print_spec(gate_up);
  const FusionSpec reads = spec_reading_row_parts(gate_up, col, 8, ReduceKind::Mean, 1024);
  EXPECT_EQ(spec_to_text(spec_from_text(spec_to_text(reads))), spec_to_text(reads));
  EXPECT_NE(spec_kernel_hash(reads), spec_kernel_hash(gate_up));
  EXPECT_NE(spec_kernel_hash(reads), spec_kernel_hash(spec_reading_row_parts(gate_up, col, 8, ReduceKind::Mean, 768)));
  EXPECT_NE(generate_kernel(reads, KernelConfig{}).source.find("ColParts<RowReduce::Mean, 8, 4>"), std::string::npos);
  KernelConfig coop;
  coop.tile_m = 128;
  coop.cooperative = true;
  EXPECT_NE(generate_kernel(reads, coop).source.find("ColParts<RowReduce::Mean, 8, 2>"), std::string::npos)
      << "a cooperative group holds 64 rows";
  EXPECT_THROW(generate_kernel(reads, library_config(128)), CodegenError) << "the library form's pass has no ColParts";
  ASSERT_GE(other, 0);
  EXPECT_THROW(spec_reading_row_parts(gate_up, other, 8, ReduceKind::Mean, 1024), std::invalid_argument);
  EXPECT_THROW(spec_reading_row_parts(gate_up, col, 0, ReduceKind::Mean, 1024), std::invalid_argument);
}
