package sandbox

import (
	"context"
	"fmt"
	"io"

	"github.com/useshards/shard/internal/agent"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// Replayed is one exec a resume ran again.
type Replayed struct {
	Argv         []string
	RecordedExit *int // nil: it never finished in the resumed session
	ExitCode     *int // nil: started again and left running
	Error        string
}

// ResumeResult is what a resume made and did.
type ResumeResult struct {
	Sandbox    *store.Sandbox
	Checkpoint string // empty: made fresh from the session's sandbox.created
	Replayed   []Replayed
}

// Resume recreates a sandbox from a ledger session: from its latest
// checkpoint that still exists (or, with none, as its sandbox was first
// made), then it replays the execs the ledger recorded after that point, in
// order. An exec that ended is run again and waited for, whatever its code;
// one that never ended is started and left running; stdin and per-exec env
// values are not in the ledger, so a replayed exec gets neither. The new
// sandbox has a new id and its own session, where the replay is recorded.
func (s *Service) Resume(ctx context.Context, session, name string) (*ResumeResult, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if _, err := s.cfg.Store.GetSession(ctx, session); err != nil {
		return nil, err
	}
	var events []store.Event
	for after := int64(0); ; {
		page, err := s.cfg.Store.Events(ctx, session, after, 1000)
		if err != nil {
			return nil, err
		}
		events = append(events, page...)
		if len(page) < 1000 {
			break
		}
		after = page[len(page)-1].Seq
	}
	plan, err := ledger.PlanResume(events, func(id string) bool {
		_, err := s.cfg.Store.GetCheckpoint(ctx, id)
		return err == nil
	})
	if err != nil {
		return nil, errdefs.Conflict("session_unusable", "ledger session %s cannot be resumed: %v", session, err)
	}
	res := &ResumeResult{Checkpoint: plan.Checkpoint}
	switch {
	case plan.Checkpoint != "":
		res.Sandbox, err = s.Restore(ctx, plan.Checkpoint, RestoreOptions{Name: name, ResumedFrom: session})
	case plan.Created.Checkpoint != "":
		return nil, errdefs.Conflict("checkpoint_gone", "ledger session %s started from checkpoint %s, which was removed, and has no later checkpoint: there is nothing to resume from", session, plan.Created.Checkpoint)
	default:
		c := plan.Created
		res.Sandbox, err = s.Create(ctx, CreateRequest{
			Name: name, Image: c.Image, Digest: c.Digest, MemoryBytes: c.MemoryBytes, CPUMillis: c.CPUMillis,
			DiskBytes: c.DiskBytes, Pids: c.Pids, Provider: c.Provider, FromSnapshot: c.FromSnapshot, ResumedFrom: session,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", session, err)
	}
	for _, pe := range plan.Execs {
		r := Replayed{Argv: pe.Started.Argv}
		if pe.Ended() && pe.Finished.ExitCode != nil {
			r.RecordedExit = pe.Finished.ExitCode
		}
		req := agent.Request{Argv: pe.Started.Argv, Dir: pe.Started.Cwd, User: pe.Started.User, TimeoutMS: pe.Started.TimeoutMS}
		// Granted secrets, as any exec gets them (values are never in the
		// ledger, names are not recorded in the exec either).
		if genv, err := s.grantEnv(ctx, res.Sandbox); err == nil {
			req.Env = genv
		}
		started := ledger.ExecStartedData{Argv: req.Argv, Cwd: req.Dir, User: req.User, TimeoutMS: req.TimeoutMS, Replay: true}
		if pe.Ended() {
			code, err := s.runReq(ctx, res.Sandbox, req, started, io.Discard)
			if err != nil {
				r.Error = err.Error()
			} else {
				r.ExitCode = &code
			}
		} else {
			sess, _, err := s.exec(ctx, res.Sandbox, req, started)
			if err != nil {
				r.Error = err.Error()
			} else {
				sess.Close() // it runs on; its end is recorded when it comes
			}
		}
		res.Replayed = append(res.Replayed, r)
	}
	s.cfg.Log.Info("resumed", "session", session, "sandbox", res.Sandbox.ID, "checkpoint", plan.Checkpoint, "replayed", len(res.Replayed))
	return res, nil
}
