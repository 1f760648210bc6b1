/* Launch counts for the launcher check (ci.sh): each kernel launch is
 * counted by its site (SRC:LINE kernel, written in by rewrite.pl) and the
 * innermost moe_*_cuda entry point it runs under (EMU_ENTRY).  When
 * EMU_LAUNCH_LOG names a file, a process appends its counts there as it
 * exits, one line per pair: "launch <TAB> entry <TAB> site <TAB> count"
 * (Criterion runs each test in a child process: each child appends its
 * own). */
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "emu.h"

static thread_local const char *entry_now = nullptr;
static std::mutex mu;
static std::map<std::pair<std::string, std::string>, long> *counts;

emu_entry_guard::emu_entry_guard(const char *f) : prev(entry_now) { entry_now = f; }
emu_entry_guard::~emu_entry_guard() { entry_now = prev; }

static void write_counts()
{
    const char *path = getenv("EMU_LAUNCH_LOG");
    if (!path || !*path || !counts) return;
    std::string out;
    for (const auto &c : *counts)
        out += "launch\t" + c.first.first + "\t" + c.first.second + "\t" + std::to_string(c.second) + "\n";
    const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    if (write(fd, out.data(), out.size()) != (ssize_t)out.size()) fprintf(stderr, "emu: %s: short write\n", path);
    close(fd);
}

void emu_count_launch(const char *site)
{
    std::lock_guard<std::mutex> g(mu);
    if (!counts) {
        counts = new std::map<std::pair<std::string, std::string>, long>;
        atexit(write_counts);
    }
    (*counts)[{entry_now ? entry_now : "-", site}]++;
}
