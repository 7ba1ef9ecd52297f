package api

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

func sessionView(ss *store.Session, name string) Session {
	return Session{Name: ss.Name, SandboxID: ss.SandboxID, SandboxName: name, Events: ss.Events,
		LastEvent: ss.LastType, LastAt: ss.LastAt, CreatedAt: ss.CreatedAt}
}

func eventView(r *http.Request, e store.Event) Event {
	v := Event{Seq: e.Seq, Session: e.Session, Type: e.Type, SandboxID: e.SandboxID, At: e.At, Data: e.Data}
	// A grant's or a policy's event says what inspect hides from a key
	// that may not read them (secret names, where they go; the policy):
	// the event stays, its data does not.
	p := auth.From(r.Context())
	switch e.Type {
	case ledger.SecretGranted, ledger.SecretUngranted:
		if !p.Can(auth.SecretRead) {
			v.Data = nil
		}
	case ledger.PolicySet, ledger.PolicyCleared:
		if !p.Can(auth.PolicyRead) {
			v.Data = nil
		}
	}
	return v
}

// sandboxNames maps the ids of existing sandboxes to their names.
func (s *Server) sandboxNames(r *http.Request) (map[string]string, error) {
	all, err := s.Sandboxes.List(r.Context())
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(all))
	for _, sb := range all {
		m[sb.ID] = sb.Name
	}
	return m, nil
}

func (s *Server) listSessions(r *http.Request) (any, int, error) {
	sessions, err := s.Ledger.Sessions(r.Context())
	if err != nil {
		return nil, 0, err
	}
	names, err := s.sandboxNames(r)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Session, 0, len(sessions))
	for _, ss := range sessions {
		out = append(out, sessionView(ss, names[ss.SandboxID]))
	}
	return map[string]any{"sessions": out}, 200, nil
}

// session is the session the path's {name} names: a session's name, or
// its sandbox's name or id (store.FindSession), so `shard ledger FORKNAME`
// finds fork-PARENT-ID.
func (s *Server) session(r *http.Request) (*store.Session, error) {
	return s.Ledger.FindSession(r.Context(), r.PathValue("name"))
}

func (s *Server) getSession(r *http.Request) (any, int, error) {
	ss, err := s.session(r)
	if err != nil {
		return nil, 0, err
	}
	names, err := s.sandboxNames(r)
	if err != nil {
		return nil, 0, err
	}
	return sessionView(ss, names[ss.SandboxID]), 200, nil
}

func intQuery(r *http.Request, key string, def, lo, hi int64) (int64, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, errdefs.Invalid("%s=%q: give a whole number from %d to %d", key, v, lo, hi)
	}
	return n, nil
}

// eventsQuery reads ?after=, ?limit= and ?follow= of a session's events.
func eventsQuery(r *http.Request) (after, limit int64, follow bool, err error) {
	if after, err = intQuery(r, "after", 0, 0, math.MaxInt64); err != nil {
		return
	}
	if limit, err = intQuery(r, "limit", 1000, 1, 10000); err != nil {
		return
	}
	follow, err = boolQuery(r, "follow")
	return
}

// sessionEvents pages through a session's events, or with ?follow=true
// streams them as NDJSON as they are appended, until the session's sandbox
// is removed or the client leaves.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request) {
	after, limit, follow, err := eventsQuery(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st := s.Ledger
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name := ss.Name
	if !follow {
		evs, err := st.Events(r.Context(), name, after, int(limit)+1)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		page := EventPage{Events: make([]Event, 0, len(evs)), Next: after}
		if int64(len(evs)) > limit {
			evs, page.More = evs[:limit], true
		}
		for _, e := range evs {
			page.Events = append(page.Events, eventView(r, e))
			page.Next = e.Seq
		}
		writeJSON(w, 200, page)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	for {
		changed := st.Changed() // before reading, so nothing appended after the read is missed
		evs, err := st.Events(r.Context(), name, after, 1000)
		if err != nil {
			return
		}
		for _, e := range evs {
			if enc.Encode(eventView(r, e)) != nil {
				return
			}
			after = e.Seq
			if e.Type == ledger.Removed {
				rc.Flush()
				return
			}
		}
		rc.Flush()
		if len(evs) == 1000 {
			continue
		}
		if len(evs) == 0 && after > 0 {
			// Followed from past the sandbox's removal: nothing more comes.
			if ss, err := st.FindSession(r.Context(), name); err == nil && ss.LastType == ledger.Removed {
				return
			}
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-s.Stopping:
			return
		}
	}
}

func (s *Server) resumeSession(r *http.Request) (any, int, error) {
	// A resume answers with the session's argv and runs it again: it
	// reveals history, which is sandbox:read's.
	if err := need(r, auth.SandboxRead); err != nil {
		return nil, 0, err
	}
	name, err := parseNewName(r)
	if err != nil {
		return nil, 0, err
	}
	// The new sandbox carries the grants and policy of the session's
	// checkpoints and of its later events: their scopes are needed, as for
	// a fork.
	ss, err := s.session(r)
	if err != nil {
		return nil, 0, err
	}
	res, err := s.Sessions.Resume(r.Context(), ss.Name, name, carried(r))
	if err != nil {
		return nil, 0, err
	}
	out := ResumeResponse{Sandbox: s.sandboxOut(r, res.Sandbox), Checkpoint: res.Checkpoint, Replayed: make([]ReplayedExec, 0, len(res.Replayed))}
	for _, x := range res.Replayed {
		out.Replayed = append(out.Replayed, ReplayedExec{Argv: x.Argv, RecordedExit: x.RecordedExit, ExitCode: x.ExitCode, Error: x.Error})
	}
	for _, x := range res.Reapplied {
		out.Reapplied = append(out.Reapplied, ReappliedChange{Event: x.Event, Secret: x.Secret, Error: x.Error})
	}
	return out, http.StatusCreated, nil
}

// removeSession removes a session and its events, once its sandbox and
// its checkpoints are gone (409 before: see store.DeleteSession).
func (s *Server) removeSession(r *http.Request) (any, int, error) {
	ss, err := s.session(r)
	if err != nil {
		return nil, 0, err
	}
	if err := s.Sessions.RemoveSession(r.Context(), ss.Name); err != nil {
		return nil, 0, err
	}
	return map[string]string{"removed": ss.Name}, 200, nil
}
