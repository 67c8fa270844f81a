// How `tfusion run` passes the signals it gets on to the command it started.
#pragma once

#include <sys/types.h>

namespace tf::cli {

// From now on, SIGINT, SIGTERM and SIGHUP this process gets are sent on to `child` (its command,
// in its process group), except those the terminal sent (Ctrl-C and a hangup reach the whole
// foreground process group, the command included): sent on too, each reached the command
// twice, and a program that saves its work on the first interrupt was cut short by the second.
void ForwardSignalsTo(pid_t child);
// Once the child has been waited for: its pid may be another process's from then on.
void StopForwardingSignals();

}  // namespace tf::cli
