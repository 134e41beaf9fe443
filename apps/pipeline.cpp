#include "apps/pipeline.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "core/error.h"
#include "parallel/pipeline_stage.h"
#ifdef KVSERVE_HAVE_MPI
#include "parallel/mpi_communicator.h"
#endif

namespace kvserve::cli {
namespace {

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::chrono::milliseconds timeout_of(const PipelineFlags& flags) {
  return std::chrono::milliseconds(static_cast<int64_t>(flags.timeout_seconds * 1000));
}

}  // namespace

void add_pipeline_flags(CLI::App* cmd, PipelineFlags& flags) {
  cmd->add_option("--pipeline-parallel", flags.ranks,
                  "Split the layers between N processes started by `mpirun -np N kvserve ...` (needs a build with "
                  "-DKVSERVE_MPI=ON); rank 0 tokenizes, schedules, samples and serves")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--pipeline-timeout", flags.timeout_seconds,
                  "Seconds a pipeline step may wait for another rank before the pipeline fails with an error")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
}

PipelineSession::PipelineSession(const PipelineFlags& flags) : flags_(flags) {
  if (flags.ranks <= 1) return;
#ifdef KVSERVE_HAVE_MPI
  if (!started_by_mpirun())
    throw Error("--pipeline-parallel " + std::to_string(flags.ranks) + " runs one process per rank: start it as `mpirun -np " +
                std::to_string(flags.ranks) + " kvserve ...`");
  comm_ = std::make_unique<MpiCommunicator>();
  if (comm_->size() != flags.ranks) {
    const std::string error = "--pipeline-parallel " + std::to_string(flags.ranks) + " but mpirun started " +
                              std::to_string(comm_->size()) + " processes: use mpirun -np " + std::to_string(flags.ranks);
    if (comm_->rank() == 0) std::fprintf(stderr, "kvserve: error: %s\n", error.c_str());
    static_cast<MpiCommunicator&>(*comm_).abort(1);
  }
#else
  throw Error("--pipeline-parallel needs kvserve built with MPI: install Open MPI (apt-get install libopenmpi-dev "
              "openmpi-bin) and configure with cmake -DKVSERVE_MPI=ON");
#endif
}

PipelineSession::~PipelineSession() = default;

int PipelineSession::rank() const { return comm_ ? comm_->rank() : 0; }

ModelLoadOptions PipelineSession::load_options(ModelLoadOptions base) const {
  base.pipeline_rank = rank();
  base.pipeline_ranks = comm_ ? comm_->size() : 1;
  return base;
}

PipelineOptions PipelineSession::engine_options(std::function<void(const std::string&)> on_failure) const {
  return {comm_.get(), timeout_of(flags_), std::move(on_failure)};
}

void PipelineSession::run_stage(const std::string& model_path, ModelLoadOptions base) const {
  const auto stage = Model::load(model_path, load_options(std::move(base)));
  const LayerRange& r = stage->layer_range();
  std::fprintf(stderr, "kvserve: pipeline rank %d of %d (pid %d): layers %lld..%lld of %lld, %.1f MiB of weights\n",
               rank(), comm_->size(), static_cast<int>(getpid()), static_cast<long long>(r.first), static_cast<long long>(r.end - 1),
               static_cast<long long>(r.total), mib(static_cast<double>(stage->resident_weight_bytes())));
  const PipelineStageStats stats = run_pipeline_stage(*stage, *comm_, timeout_of(flags_));
  std::fprintf(stderr, "kvserve: pipeline rank %d: %lld steps, %lld tokens, %llu bytes sent (%.1f per token), "
               "peak RSS %.1f MiB\n", rank(), static_cast<long long>(stats.steps), static_cast<long long>(stats.tokens),
               static_cast<unsigned long long>(comm_->bytes_sent()),
               static_cast<double>(comm_->bytes_sent()) / std::max<double>(1.0, static_cast<double>(stats.tokens)),
               peak_rss_mib());
}

void PipelineSession::report(const Model& stage) const {
  if (!comm_) return;
  const LayerRange& r = stage.layer_range();
  std::fprintf(stderr, "kvserve: pipeline rank 0 of %d: layers %lld..%lld of %lld, %.1f MiB of weights, "
               "%llu bytes sent, peak RSS %.1f MiB\n", comm_->size(), static_cast<long long>(r.first),
               static_cast<long long>(r.end - 1), static_cast<long long>(r.total),
               mib(static_cast<double>(stage.resident_weight_bytes())),
               static_cast<unsigned long long>(comm_->bytes_sent()), peak_rss_mib());
}

void PipelineSession::guard(const std::function<void()>& body) {
  if (!comm_) return body();
  try {
    body();
    if (rank() == 0) end_pipeline(*comm_, timeout_of(flags_));  // the other ranks' run_stage returns
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvserve: error: pipeline rank %d: %s\n", rank(), e.what());
    std::fflush(stderr);
#ifdef KVSERVE_HAVE_MPI
    static_cast<MpiCommunicator&>(*comm_).abort(1);
#endif
    throw;
  }
}

}  // namespace kvserve::cli
