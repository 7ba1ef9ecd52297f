// The fork tree, walked: GET /v0/tree answers nested TreeNodes, and most
// questions about them ("where is this sandbox", "what forks are there")
// are a walk.

import type { TreeNode } from "./types.js";

/** Every node of the trees, depth first, each before what came from it (in the server's order: oldest first). */
export function* walkTree(nodes: TreeNode | readonly TreeNode[]): Generator<TreeNode> {
  const stack: TreeNode[] = Array.isArray(nodes) ? [...nodes].reverse() : [nodes as TreeNode];
  for (let n = stack.pop(); n; n = stack.pop()) {
    yield n;
    for (let i = (n.children?.length ?? 0) - 1; i >= 0; i--) stack.push(n.children![i]!);
  }
}

/** The first node (depth first) whose id or name is idOrName; undefined if none. */
export function findNode(nodes: TreeNode | readonly TreeNode[], idOrName: string): TreeNode | undefined {
  for (const n of walkTree(nodes)) if (n.id === idOrName || n.name === idOrName) return n;
  return undefined;
}
