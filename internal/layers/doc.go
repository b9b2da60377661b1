// Package layers holds the test that keeps cronstream's packages layered as
// docs/design.md draws them: each package may import only packages of the
// layers below its own (and, inside its layer, only the arrows the table
// names), the pure layers depend on neither NATS nor Redis, the Redis layer
// on no NATS package and the NATS client on no Redis package, and no view
// imports the firing engine. A new package fails the test until it is
// placed in the table (layers_test.go).
//
// It also holds the size budget of non-test Go (size_test.go): no function
// over 100 lines and no file over 800, but for the exceptions its table
// names with their reasons.
package layers
