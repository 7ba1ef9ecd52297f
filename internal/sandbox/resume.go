package sandbox

import (
	"context"
	"fmt"
	"io"
	"math"

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

// Reapplied is one grant or policy change a resume made again.
type Reapplied struct {
	Event  string // ledger.SecretGranted, ...
	Secret string // for the grant events
	Error  string
}

// ResumeResult is what a resume made and did.
type ResumeResult struct {
	Sandbox    *store.Sandbox
	Checkpoint string // empty: made fresh from the session's sandbox.created
	Replayed   []Replayed
	Reapplied  []Reapplied
}

// Resume recreates a sandbox from a ledger session: from its latest
// checkpoint that still exists (or, with none, as its sandbox was first
// made), then it replays the execs the ledger recorded after that point, in
// order. An exec that ended is run again and waited for, whatever its code;
// one that never ended is started and left running; stdin and per-exec env
// values are not in the ledger, so a replayed exec gets neither. Grants and
// policy changes recorded after that point are made again too, in their
// place among the execs (a replayed exec gets the grants of its moment); one
// that fails (its secret was removed since) is reported, and replay goes on.
// The new sandbox has a new id and its own session, where the replay is
// recorded.
//
// allow, if not nil, is asked first whether the new sandbox may carry
// secret grants and a network policy, as the session's checkpoints or its
// later events may give it (the API checks the caller's scopes there).
func (s *Service) Resume(ctx context.Context, session, name string, allow func(grants, policy bool) error) (*ResumeResult, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if _, err := s.cfg.Store.GetSession(ctx, session); err != nil {
		return nil, err
	}
	if err := s.floor.check("resume ledger session " + session); err != nil {
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
	if allow != nil {
		cks, err := s.cfg.Store.ListCheckpoints(ctx, session)
		if err != nil {
			return nil, err
		}
		grants, policy := ledger.Carries(events)
		for _, ck := range cks {
			grants = grants || len(ck.Grants) > 0
			policy = policy || ck.Policy != nil
		}
		if err := allow(grants, policy); err != nil {
			return nil, err
		}
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
			Name: name, Image: c.Image, Digest: c.Digest, Bounds: c.Bounds,
			Provider: c.Provider, FromSnapshot: c.FromSnapshot, ResumedFrom: session,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", session, err)
	}
	changes := plan.Changes
	reapply := func(before int64) {
		for len(changes) > 0 && changes[0].Seq < before {
			res.Reapplied = append(res.Reapplied, s.reapply(ctx, res, changes[0]))
			changes = changes[1:]
		}
	}
	for _, pe := range plan.Execs {
		reapply(pe.Seq)
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
	reapply(math.MaxInt64)
	s.cfg.Log.Info("resumed", "session", session, "sandbox", res.Sandbox.ID, "checkpoint", plan.Checkpoint, "replayed", len(res.Replayed), "reapplied", len(res.Reapplied))
	return res, nil
}

// reapply makes one grant or policy change again on res.Sandbox, and keeps
// its record (with the grants a later exec gets) current.
func (s *Service) reapply(ctx context.Context, res *ResumeResult, c ledger.PlannedChange) Reapplied {
	r := Reapplied{Event: c.Type, Secret: c.Grant.Secret}
	var sb *store.Sandbox
	var err error
	switch c.Type {
	case ledger.SecretGranted:
		sb, err = s.Grant(ctx, res.Sandbox.ID, GrantRequest{Secret: c.Grant.Secret, Env: c.Grant.Env, File: c.Grant.File})
	case ledger.SecretUngranted:
		sb, err = s.Ungrant(ctx, res.Sandbox.ID, c.Grant.Secret)
	case ledger.PolicySet:
		sb, err = s.SetPolicy(ctx, res.Sandbox.ID, c.Policy)
	case ledger.PolicyCleared:
		sb, err = s.SetPolicy(ctx, res.Sandbox.ID, nil)
	}
	if err != nil {
		r.Error = err.Error()
	} else if sb != nil {
		res.Sandbox = sb
	}
	return r
}
