//! Service tests: the real server on 127.0.0.1:0, over HTTP, per endpoint group. Tests
//! marked with `both_backends!` run on SQLite and on PostgreSQL (skipped with a visible
//! message when PostgreSQL is unreachable, unless DPREC_REQUIRE_POSTGRES=1).

mod helpers;

mod fake;

mod admin;
mod auth;
mod bulk_ingest;
mod catalogue;
mod continual;
mod digests;
mod hardening;
mod health;
mod holds;
mod honest;
mod item_info;
mod keys;
mod ldp;
mod leaks;
mod lease;
mod ledger;
mod models;
mod nbm;
mod operator;
mod pages;
mod predict;
mod private_gd;
mod rating_level;
mod ratings;
mod recommend;
mod snapshot;
mod suffstats;
mod topn;
mod users;
