// Runs DEDUCTs and REVERTs through go-redis or rueidis and prints every
// reply, typed, as JSON.
//
// tests/clients.rs starts a Redis Cluster and stockgate, builds this
// module once per run into <target>/client-envs/go/, then runs
//
//	driver LIBRARY PORT MODE < plan.json
//
// LIBRARY is go-redis or rueidis. plan.json is {"commands": [["DEDUCT",
// "sku", "3", "req-1", "ORD-1"], ["REVERT", "sku", "req-1"], ...]}. MODE:
//
//   - plain:    the library's default client, one command at a time
//     (go-redis Do, rueidis Do with an Arbitrary command).
//   - pipeline: every command at once (a go-redis Pipeline, rueidis
//     DoMulti), replies in order.
//   - concurrent: go-redis only: every command from its own goroutine, all
//     at once, through a pool of poolSize connections, so the pool hands
//     its few connections from one command to the next.
//
// Output, one JSON object: {"client", "version", "replies": [reply, ...],
// "pool": {...}} where a reply is {"int": n}, {"str": s}, {"null": true},
// a list of replies, or {"error": message, "class": error type}. The test
// compares them with what stockgate must answer; nothing is judged here.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// PoolSize in the concurrent mode: far fewer connections than commands, so
// every connection serves many of them.
const poolSize = 4

type output struct {
	Client  string `json:"client"`
	Version string `json:"version"`
	// The Go it was built with: go-redis names it in its handshake.
	Runtime string `json:"runtime"`
	Replies []any  `json:"replies"`
	// go-redis's concurrent mode: the pool's own counters, for the test to
	// compare with the connections it saw.
	Pool *redis.PoolStats `json:"pool,omitempty"`
}

func errorReply(err error) map[string]any {
	return map[string]any{"error": err.Error(), "class": fmt.Sprintf("%T", err)}
}

// typedGoRedis types a go-redis reply: with RESP3, integers are int64,
// bulk strings string, arrays []interface{}.
func typedGoRedis(value any, err error) any {
	if err != nil && !errors.Is(err, redis.Nil) {
		var redisErr redis.Error
		if !errors.As(err, &redisErr) {
			// Not a server reply: the driver failed, and the test with it.
			fail("go-redis: %v", err)
		}
		return errorReply(err)
	}
	switch v := value.(type) {
	case nil:
		return map[string]any{"null": true}
	case int64:
		return map[string]any{"int": v}
	case string:
		return map[string]any{"str": v}
	case []any:
		items := make([]any, len(v))
		for i, item := range v {
			items[i] = typedGoRedis(item, nil)
		}
		return items
	default:
		fail("go-redis: unexpected reply type %T: %v", value, value)
		return nil
	}
}

// typedRueidis types a rueidis message by its RESP type.
func typedRueidis(message rueidis.RedisMessage) any {
	switch {
	case message.IsNil():
		return map[string]any{"null": true}
	case message.IsInt64():
		v, _ := message.AsInt64()
		return map[string]any{"int": v}
	case message.IsString():
		v, _ := message.ToString()
		return map[string]any{"str": v}
	case message.IsArray():
		items, _ := message.ToArray()
		out := make([]any, len(items))
		for i, item := range items {
			out[i] = typedRueidis(item)
		}
		return out
	default:
		fail("rueidis: unexpected reply %v", message.String())
		return nil
	}
}

func rueidisResult(result rueidis.RedisResult) any {
	if err := result.Error(); err != nil {
		if _, ok := rueidis.IsRedisErr(err); !ok {
			fail("rueidis: %v", err)
		}
		return errorReply(err)
	}
	message, _ := result.ToMessage()
	return typedRueidis(message)
}

func args(command []string) []any {
	out := make([]any, len(command))
	for i, arg := range command {
		out[i] = arg
	}
	return out
}

func goRedis(ctx context.Context, port, mode string, commands [][]string) output {
	// STOCKGATE_TEST_USER and STOCKGATE_TEST_PASSWORD, when set: go-redis
	// then logs in with HELLO 3 AUTH <user> <password>.
	opt := &redis.Options{
		Addr:     "127.0.0.1:" + port,
		Username: os.Getenv("STOCKGATE_TEST_USER"),
		Password: os.Getenv("STOCKGATE_TEST_PASSWORD"),
	}
	// STOCKGATE_TEST_TLS_CA (and STOCKGATE_TEST_TLS_CERT and _KEY, a client
	// certificate), when set: TLS to stockgate, verified against that CA.
	if ca := os.Getenv("STOCKGATE_TEST_TLS_CA"); ca != "" {
		opt.TLSConfig = clientTLS(ca, os.Getenv("STOCKGATE_TEST_TLS_CERT"), os.Getenv("STOCKGATE_TEST_TLS_KEY"))
	}
	if mode == "concurrent" {
		opt.PoolSize = poolSize
	}
	// Everything else is go-redis's default: RESP3, 3 retries, its pool.
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	out := output{Client: "go-redis", Version: redis.Version()}
	switch mode {
	case "plain":
		for _, command := range commands {
			out.Replies = append(out.Replies, typedGoRedis(rdb.Do(ctx, args(command)...).Result()))
		}
	case "pipeline":
		pipe := rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(commands))
		for i, command := range commands {
			cmds[i] = pipe.Do(ctx, args(command)...)
		}
		// Exec returns the first error reply; each Cmd holds its own.
		pipe.Exec(ctx)
		for _, cmd := range cmds {
			out.Replies = append(out.Replies, typedGoRedis(cmd.Result()))
		}
	case "concurrent":
		out.Replies = make([]any, len(commands))
		var wg sync.WaitGroup
		for i, command := range commands {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out.Replies[i] = typedGoRedis(rdb.Do(ctx, args(command)...).Result())
			}()
		}
		wg.Wait()
		out.Pool = rdb.PoolStats()
	default:
		fail("unknown mode %s", mode)
	}
	return out
}

func rueidisClient(ctx context.Context, port, mode string, commands [][]string) output {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{"127.0.0.1:" + port},
		// stockgate refuses CLIENT TRACKING: it can't send the
		// invalidations a client-side cache relies on. Without this,
		// rueidis's handshake fails with ErrNoCache.
		DisableCache: true,
	})
	if err != nil {
		fail("rueidis: %v", err)
	}
	defer client.Close()
	build := func(command []string) rueidis.Completed {
		return client.B().Arbitrary(command[0]).Args(command[1:]...).Build()
	}
	out := output{Client: "rueidis", Version: rueidis.LibVer}
	switch mode {
	case "plain":
		for _, command := range commands {
			out.Replies = append(out.Replies, rueidisResult(client.Do(ctx, build(command))))
		}
	case "pipeline":
		cmds := make(rueidis.Commands, len(commands))
		for i, command := range commands {
			cmds[i] = build(command)
		}
		for _, result := range client.DoMulti(ctx, cmds...) {
			out.Replies = append(out.Replies, rueidisResult(result))
		}
	default:
		fail("unknown mode %s", mode)
	}
	return out
}

// clientTLS verifies the server against the PEM CA in caFile, and presents
// the client certificate in certFile and keyFile when given.
func clientTLS(caFile, certFile, keyFile string) *tls.Config {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		fail("reading the CA: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		fail("no certificate in %s", caFile)
	}
	config := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			fail("the client certificate: %v", err)
		}
		config.Certificates = []tls.Certificate{cert}
	}
	return config
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: driver go-redis|rueidis PORT MODE < plan.json")
	}
	library, port, mode := os.Args[1], os.Args[2], os.Args[3]
	var plan struct {
		Commands [][]string `json:"commands"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&plan); err != nil {
		fail("reading the plan: %v", err)
	}
	ctx := context.Background()
	var out output
	switch library {
	case "go-redis":
		out = goRedis(ctx, port, mode, plan.Commands)
	case "rueidis":
		out = rueidisClient(ctx, port, mode, plan.Commands)
	default:
		fail("unknown library %s", library)
	}
	out.Runtime = runtime.Version()
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("%v", err)
	}
}
