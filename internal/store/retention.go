package store

import (
	"context"

	"github.com/useshards/shard/internal/project"
)

// ResumeUsers lists the sandboxes, of every project, whose ledger session a
// resume would start from checkpoint id: the session's latest checkpoint,
// or, when it has none of its own, the checkpoint its sandbox was made from
// (a fork's, a restore's). This is ledger.PlanResume's choice, read from the
// records instead of the events, so that it costs two index lookups per
// sandbox, however long the sessions are. A checkpoint no sandbox names
// here is needed by no sandbox: what it gave them, they hold on their own
// (a restore copies its files and memory).
func (s *Store) ResumeUsers(ctx context.Context, id string) ([]string, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, `SELECT b.name FROM sandboxes b
		WHERE COALESCE(
			(SELECT c.id FROM checkpoints c WHERE c.project = b.project AND c.session = json_extract(b.doc, '$.session')
				ORDER BY json_extract(c.doc, '$.seq') DESC LIMIT 1),
			(SELECT json_extract(e.data, '$.checkpoint') FROM events e WHERE e.project = b.project AND e.session = json_extract(b.doc, '$.session')
				ORDER BY e.seq LIMIT 1)
		) = ? ORDER BY b.name`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}
