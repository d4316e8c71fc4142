//! A small migration runner: the SQL files of `migrations/<backend>/` are embedded in
//! the binary and applied in order, each in its own transaction, recorded in
//! `dprec_migrations`.

use sqlx::AnyPool;

use super::{now_ms, Backend};

const SQLITE: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "user_tokens",
        include_str!("../../migrations/sqlite/0002_user_tokens.sql"),
    ),
    (
        9,
        "private_gd",
        include_str!("../../migrations/sqlite/0009_private_gd.sql"),
    ),
    (
        10,
        "rating_rho",
        include_str!("../../migrations/sqlite/0010_rating_rho.sql"),
    ),
    (
        11,
        "rating_charges_by_user_release",
        include_str!("../../migrations/sqlite/0011_rating_charges_by_user_release.sql"),
    ),
    (
        12,
        "rating_charge_sets",
        include_str!("../../migrations/sqlite/0012_rating_charge_sets.sql"),
    ),
    (
        14,
        "release_series",
        include_str!("../../migrations/sqlite/0014_release_series.sql"),
    ),
    (
        15,
        "series_offered",
        include_str!("../../migrations/sqlite/0015_series_offered.sql"),
    ),
    (
        16,
        "lazy_rating_spends",
        include_str!("../../migrations/sqlite/0016_lazy_rating_spends.sql"),
    ),
    (
        18,
        "release_holds",
        include_str!("../../migrations/sqlite/0018_release_holds.sql"),
    ),
    (
        19,
        "release_visible_at",
        include_str!("../../migrations/sqlite/0019_release_visible_at.sql"),
    ),
    (
        20,
        "item_info",
        include_str!("../../migrations/sqlite/0020_item_info.sql"),
    ),
];
const POSTGRES: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "user_tokens",
        include_str!("../../migrations/postgres/0002_user_tokens.sql"),
    ),
    (
        9,
        "private_gd",
        include_str!("../../migrations/postgres/0009_private_gd.sql"),
    ),
    (
        10,
        "rating_rho",
        include_str!("../../migrations/postgres/0010_rating_rho.sql"),
    ),
    (
        11,
        "rating_charges_by_user_release",
        include_str!("../../migrations/postgres/0011_rating_charges_by_user_release.sql"),
    ),
    (
        12,
        "rating_charge_sets",
        include_str!("../../migrations/postgres/0012_rating_charge_sets.sql"),
    ),
    (
        13,
        "ratings_fillfactor",
        include_str!("../../migrations/postgres/0013_ratings_fillfactor.sql"),
    ),
    (
        14,
        "release_series",
        include_str!("../../migrations/postgres/0014_release_series.sql"),
    ),
    (
        15,
        "series_offered",
        include_str!("../../migrations/postgres/0015_series_offered.sql"),
    ),
    (
        16,
        "lazy_rating_spends",
        include_str!("../../migrations/postgres/0016_lazy_rating_spends.sql"),
    ),
    (
        17,
        "users_curves_inline",
        include_str!("../../migrations/postgres/0017_users_curves_inline.sql"),
    ),
    (
        18,
        "release_holds",
        include_str!("../../migrations/postgres/0018_release_holds.sql"),
    ),
    (
        19,
        "release_visible_at",
        include_str!("../../migrations/postgres/0019_release_visible_at.sql"),
    ),
    (
        20,
        "item_info",
        include_str!("../../migrations/postgres/0020_item_info.sql"),
    ),
];

pub async fn run(pool: &AnyPool, backend: Backend) -> Result<(), sqlx::Error> {
    let list = match backend {
        Backend::Sqlite => SQLITE,
        Backend::Postgres => POSTGRES,
    };
    // The migrations table is created under the same advisory lock as the migrations:
    // two PostgreSQL servers starting together on a fresh database would otherwise both
    // run CREATE TABLE IF NOT EXISTS and one fails on the catalog's unique index
    // (`pg_type_typname_nsp_index`). Under the lock the second sees the committed table.
    let mut tx = pool.begin().await?;
    if backend == Backend::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock(7215441306)")
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dprec_migrations (version BIGINT PRIMARY KEY, \
         name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    for &(version, name, sql) in list {
        let mut tx = pool.begin().await?;
        if backend == Backend::Postgres {
            // Two processes starting together: the second waits, then sees the version.
            sqlx::query("SELECT pg_advisory_xact_lock(7215441306)")
                .execute(&mut *tx)
                .await?;
        }
        let done = sqlx::query("SELECT version FROM dprec_migrations WHERE version = $1")
            .bind(version)
            .fetch_optional(&mut *tx)
            .await?;
        if done.is_some() {
            tx.rollback().await?;
            continue;
        }
        for stmt in split_statements(sql) {
            sqlx::query(&stmt).execute(&mut *tx).await?;
        }
        sqlx::query("INSERT INTO dprec_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
            .bind(version)
            .bind(name)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        log::info!("applied migration {version:04}_{name}");
    }
    Ok(())
}

/// Splits a migration file into statements (no semicolons inside our statements).
fn split_statements(sql: &str) -> Vec<String> {
    let without_comments: String = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
