package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// controlCall makes one call on a sandbox's control server directly: the
// same uRPC runsc itself uses (a JSON object {"method","arg"} over the
// sandbox's Unix socket runsc-<id>.sock in the runsc root, answered by
// {"success","err","result"}).
//
// Why not `runsc pause`: every runsc command is a new 100 MB Go process that
// loads the container's state first, ~20 ms before it does anything. A fork
// pauses and resumes its source, and the source is frozen for all of that.
// A direct call costs well under a millisecond.
func (p *Provider) controlCall(ctx context.Context, id, method string) error {
	return p.controlCallFiles(ctx, id, method, nil, nil)
}

// controlCallFiles is controlCall with an argument and files: the files go
// with the request as SCM_RIGHTS (uRPC's FilePayload), in order.
func (p *Provider) controlCallFiles(ctx context.Context, id, method string, arg any, files []*os.File) error {
	sock := filepath.Join(p.opts.Root, "runsc-"+id+".sock")
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return &dialError{err}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(time.Minute))
	}
	req, _ := json.Marshal(map[string]any{"method": method, "arg": arg})
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := conn.(*net.UnixConn).WriteMsgUnix(req, oob, nil); err != nil {
		return err
	}
	var res struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if !res.Success {
		return fmt.Errorf("%s: %s", method, res.Err)
	}
	return nil
}

// dialError says the control socket could not be reached: the call was
// never made. Any other error may come after the Sentry acted on it.
type dialError struct{ err error }

func (e *dialError) Error() string { return "control socket: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }
