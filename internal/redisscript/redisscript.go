// Package redisscript is cronstream's one way of running Lua scripts on
// Redis. A Script is sent with EVALSHA; a call that Redis answers with
// NOSCRIPT did not run (an empty script cache: a fresh, restarted or
// failed-over server), so it is sent again with EVAL, which also loads the
// script for the calls after it. Single calls (Script.Run) and pipelined
// batches (Batch) follow that one rule.
package redisscript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// Script is one Lua script.
type Script struct {
	src  string
	hash string
}

// New returns the script with source src.
func New(src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{src: src, hash: hex.EncodeToString(sum[:])}
}

// Source is the script's Lua source.
func (s *Script) Source() string { return s.src }

// Hash is the SHA-1 Redis knows the script by (EVALSHA's argument).
func (s *Script) Hash() string { return s.hash }

// Client is what runs a single call: any go-redis client (single node,
// Sentinel, Cluster), or a pipeline.
type Client interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// Run runs the script once with keys and args and returns its reply.
func (s *Script) Run(ctx context.Context, c Client, keys []string, args ...any) *redis.Cmd {
	cmd := s.Cmd(ctx, keys, args...)
	_ = c.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		cmd = s.eval(ctx, cmd)
		_ = c.Process(ctx, cmd)
	}
	return cmd
}

// Cmd builds the script's EVALSHA command, as go-redis builds it (a
// cluster client routes it by its first key), without sending it.
// Callers that lay out many commands in one buffer build the same
// arguments themselves and pass the command to Batch.Process.
func (s *Script) Cmd(ctx context.Context, keys []string, args ...any) *redis.Cmd {
	all := make([]any, 0, 3+len(keys)+len(args))
	all = append(all, "evalsha", s.hash, len(keys))
	for _, k := range keys {
		all = append(all, k)
	}
	return s.command(ctx, append(all, args...))
}

// command makes the command of arguments all ("evalsha" or "eval", hash or
// source, number of keys, keys, arguments).
func (s *Script) command(ctx context.Context, all []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, all...)
	if n, _ := all[2].(int); n > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// eval is sha's command with EVAL and the source instead.
func (s *Script) eval(ctx context.Context, sha *redis.Cmd) *redis.Cmd {
	all := append([]any{"eval", s.src}, sha.Args()[2:]...)
	return s.command(ctx, all)
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// Batch sends script calls, and plain commands beside them, in one
// pipeline. Calls that Redis answers with NOSCRIPT are sent again with EVAL
// in a second pipeline, in their order; each call's command then holds the
// reply of the call that ran. Calls of a batch are not atomic together: a
// call sent again runs after the calls of the first pipeline that did run.
type Batch struct {
	client redis.UniversalClient
	pipe   redis.Pipeliner
	calls  []batchCall
}

type batchCall struct {
	script *Script
	cmd    *redis.Cmd
}

// NewBatch returns an empty batch on c.
func NewBatch(c redis.UniversalClient) *Batch { return &Batch{client: c, pipe: c.Pipeline()} }

// Pipe is the batch's pipeline, for plain commands sent beside the scripts.
func (b *Batch) Pipe() redis.Pipeliner { return b.pipe }

// Run adds a call of s with keys and args and returns its command, whose
// reply is there once Exec returned.
func (b *Batch) Run(ctx context.Context, s *Script, keys []string, args ...any) *redis.Cmd {
	cmd := s.Cmd(ctx, keys, args...)
	b.Process(ctx, s, cmd)
	return cmd
}

// Process adds cmd, an EVALSHA of s built like Script.Cmd builds it.
func (b *Batch) Process(ctx context.Context, s *Script, cmd *redis.Cmd) {
	b.calls = append(b.calls, batchCall{s, cmd})
	_ = b.pipe.Process(ctx, cmd)
}

// Len is the number of script calls added.
func (b *Batch) Len() int { return len(b.calls) }

// Exec sends the batch. Each command holds its own reply or error; Exec
// returns nothing, as a pipeline's first error says little about the rest.
func (b *Batch) Exec(ctx context.Context) {
	_, _ = b.pipe.Exec(ctx)
	calls := b.calls
	b.calls = nil
	var again redis.Pipeliner
	var sent []*redis.Cmd
	for _, call := range calls {
		if !isNoScript(call.cmd.Err()) {
			continue
		}
		if again == nil {
			again = b.client.Pipeline()
		}
		cmd := call.script.eval(ctx, call.cmd)
		_ = again.Process(ctx, cmd)
		sent = append(sent, cmd, call.cmd)
	}
	if again == nil {
		return
	}
	_, _ = again.Exec(ctx)
	for i := 0; i < len(sent); i += 2 {
		ran, orig := sent[i], sent[i+1]
		orig.SetVal(ran.Val())
		orig.SetErr(ran.Err())
	}
}
