package guest

import (
	"os"

	"golang.org/x/sys/unix"
)

// detachStdio points the agent's stdout and stderr at /dev/null once it is
// up. They are a file on the host (the runtime's log, read when a sandbox
// fails to come up), and any root process in the sandbox can reopen them
// through /proc/1/fd/1: a way to write past the sandbox's disk bound onto
// the host's own filesystem. What the agent logs after its start is
// dropped; what it said while starting stays in that file.
func detachStdio() error {
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(null.Fd()), fd, 0); err != nil {
			return err
		}
	}
	return nil
}
