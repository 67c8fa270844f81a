// Signals passed on to the command: see forward_signals.h.
#include "cli/forward_signals.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

namespace tf::cli {

namespace {

volatile pid_t g_forward_to = 0;

void Forward(int sig, siginfo_t* info, void*) {
  const int saved_errno = errno;  // it may interrupt any thread of ours
  const pid_t child = g_forward_to;
  // The kernel sent it (a terminal's): the command got it as well, if it is still in our
  // foreground process group. getpgid is a plain system call here.
  if (child > 0 && !(info != nullptr && info->si_code == SI_KERNEL && getpgid(child) == getpgrp()))
    kill(child, sig);
  errno = saved_errno;
}

}  // namespace

void ForwardSignalsTo(pid_t child) {
  g_forward_to = child;
  struct sigaction sa = {};
  sa.sa_sigaction = &Forward;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
}

void StopForwardingSignals() { g_forward_to = 0; }

}  // namespace tf::cli
