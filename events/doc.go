// Package events is cronstream's public Go API for its events: the event
// vocabulary and the write side of the configuration stream, under the
// names programs have always used.
//
// Since the event contract and the NATS client became packages of their
// own, events declares nothing itself: it re-exports every exported name of
// package contract (the envelope, every event type and its data, the Entry
// state and its validation, cron parsing, subject and stream names, ids,
// shards, fail-pause requests) and of package streamclient (the streams'
// configuration and NewClient's config client). Types are aliases, so
// events.Entry and contract.Entry are one type with the same methods;
// constants are the same constants; functions and sentinel errors are
// variables holding the same values, so errors.Is(err, events.ErrNotFound)
// matches whichever name the error was made with. A program keeps working
// unchanged; a program that wants the contract without a NATS dependency
// imports contract. Inside cronstream, packages that must not depend on
// NATS (the Redis layer, the views) import contract directly.
package events
