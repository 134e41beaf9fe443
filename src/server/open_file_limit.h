#pragma once
// Every connection the server holds is a file descriptor, and the usual soft
// limit (1024) is below the 1,000 slow or idle connections it must hold.
#include <cstddef>

namespace kvserve::server {

// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the soft limit
// now in force (0 when it cannot be read).
size_t raise_open_file_limit();

// Below this the server cannot hold 1,000 connections plus its own files.
constexpr size_t kWantedOpenFiles = 4096;

}  // namespace kvserve::server
