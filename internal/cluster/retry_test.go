package cluster

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// flakyKV fails the first n writes with err, then answers.
type flakyKV struct {
	clientv3.KV
	n     int
	err   error
	calls int
}

type flakyTxn struct {
	clientv3.Txn
	kv   *flakyKV
	cmps int
}

func (k *flakyKV) Txn(context.Context) clientv3.Txn { return &flakyTxn{kv: k} }
func (t *flakyTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps += len(cs)
	return t
}
func (t *flakyTxn) Then(...clientv3.Op) clientv3.Txn { return t }
func (t *flakyTxn) Else(...clientv3.Op) clientv3.Txn { return t }
func (t *flakyTxn) Commit() (*clientv3.TxnResponse, error) {
	t.kv.calls++
	if t.cmps != 1 {
		return nil, errors.New("the comparisons were not sent again")
	}
	if t.kv.calls <= t.kv.n {
		return nil, t.kv.err
	}
	return &clientv3.TxnResponse{Succeeded: true}, nil
}

func TestRetryKV(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		fails     int
		err       error
		wantErr   bool
		wantCalls int
	}{
		{"a leader election", 2, rpctypes.ErrLeaderChanged, false, 3},
		{"no leader yet", 1, rpctypes.ErrNoLeader, false, 2},
		{"an election that outlasts the tries", 10, rpctypes.ErrLeaderChanged, true, 6},
		{"a refusal is not retried", 1, rpctypes.ErrPermissionDenied, true, 1},
	} {
		f := &flakyKV{n: tc.fails, err: tc.err}
		resp, err := retryKV{f}.Txn(ctx).If(clientv3.Compare(clientv3.Version("k"), "=", 0)).Then(clientv3.OpPut("k", "v")).Commit()
		if (err != nil) != tc.wantErr || f.calls != tc.wantCalls || (err == nil && !resp.Succeeded) {
			t.Errorf("%s: %v after %d calls, want error %v after %d", tc.name, err, f.calls, tc.wantErr, tc.wantCalls)
		}
	}
}
