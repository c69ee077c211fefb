#pragma once
// PyTorch's float64 multi_head_attention_forward as a child process, for the benchmarks' side-by-side
// timings: bench/torch_mha.py BATCH LENGTH MODEL_DIM HEADS THREADS REPEATS, started with posix_spawn
// (an argument vector, no shell) with OPENBLAS/OMP/MKL_NUM_THREADS set to THREADS, prints one line
// "wall cpu": the best wall seconds of REPEATS runs and the CPU seconds of that run.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace attnref::bench {

/// Runs bench/torch_mha.py (or `script`, another bench/ script with the same arguments and output line;
/// ATTNREF_BENCH_DIR) with `python` and reads its line into wall and cpu; false when the process cannot
/// start, fails or prints something else.
inline bool torch_mha_seconds(const std::string& python, std::size_t batch, std::size_t length, std::size_t model_dim,
                              std::size_t heads, std::size_t threads, std::size_t repeats, double& wall, double& cpu,
                              const char* script = "torch_mha.py") {
    std::vector<std::string> args{python, std::string(ATTNREF_BENCH_DIR "/") + script, std::to_string(batch), std::to_string(length),
                                  std::to_string(model_dim), std::to_string(heads), std::to_string(threads), std::to_string(repeats)};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
        if (std::strncmp(*e, "OPENBLAS_NUM_THREADS=", 21) && std::strncmp(*e, "OMP_NUM_THREADS=", 16) && std::strncmp(*e, "MKL_NUM_THREADS=", 16))
            env.emplace_back(*e);
    for (const char* v : {"OPENBLAS_NUM_THREADS=", "OMP_NUM_THREADS=", "MKL_NUM_THREADS="}) env.push_back(v + std::to_string(threads));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int fds[2];
    if (::pipe(fds) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, python.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    std::string out;
    char buf[256];
    if (rc == 0)
        for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    if (rc != 0) return false;
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
    return std::sscanf(out.c_str(), "%lf %lf", &wall, &cpu) == 2;
}

}  // namespace attnref::bench
