// Waiting for an event in a test, shared by the unit and integration tests.

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Waits until cond() holds, and throws (naming what) if it still does not
 * after ms: tests wait for the event itself, never for a fixed time, and the
 * bound is only there so that a client that never gets there fails instead
 * of hanging (generous: a loaded machine is slow, not wrong).
 */
export async function until(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = performance.now() + ms;
  while (!cond()) {
    if (performance.now() > deadline) throw new Error(`waited ${ms} ms for ${what}`);
    await sleep(2);
  }
}
