// Not built in CI (no Go toolchain there); run `go mod tidy` to fetch
// go-redis and write go.sum before `go run .`.
module example.com/stockgate-deduct

go 1.21

require github.com/redis/go-redis/v9 v9.14.0
